// libdispatch, on its own: a read source started on a socket whose write source's handler has
// filled it (written until EAGAIN) never fires, although bytes are queued for it
// (docs/reliability.md, intended difference `readerAfterFullWriter`). `make reader-probe` builds
// and runs it; it exits 1 when the read source stayed silent, 0 when it fired.
#include <dispatch/dispatch.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

int main(void) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) return 2;
  int fd = fds[0];
  dispatch_queue_t queue = dispatch_queue_create("probe", NULL);
  dispatch_source_t writer = dispatch_source_create(DISPATCH_SOURCE_TYPE_WRITE, (uintptr_t)fd, 0, queue);
  dispatch_source_set_event_handler(writer, ^{
    static char chunk[4096];
    while (write(fd, chunk, sizeof chunk) > 0) {
    }
  });
  dispatch_source_t reader = dispatch_source_create(DISPATCH_SOURCE_TYPE_READ, (uintptr_t)fd, 0, queue);
  __block int events = 0;
  dispatch_source_set_event_handler(reader, ^{
    char bytes[200];
    if (read(fd, bytes, sizeof bytes) > 0) events++;
  });
  char queued[82] = {0};
  if (write(fds[1], queued, sizeof queued) != (ssize_t)sizeof queued) return 2;
  dispatch_resume(writer);
  usleep(200000);  // the writer's handler has filled the socket
  dispatch_sync(queue, ^{
  });
  dispatch_resume(reader);
  usleep(2000000);
  __block int seen = 0;
  dispatch_sync(queue, ^{
    seen = events;
  });
  printf("read source events in 2 s with 82 bytes queued: %d (%s)\n", seen,
         seen ? "fired" : "silent: libdispatch's reader after a full writer");
  return seen ? 0 : 1;
}
