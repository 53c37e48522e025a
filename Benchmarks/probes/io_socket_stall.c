// The libdispatch stall behind IOChannel's second C channel for sockets
// (docs/io.md, "One channel reading and writing a socket at once"), in C.
//
// Each round: a loopback TCP pair; the server echoes what it reads through one
// stream channel (read 256 KiB, write it back, read again); the client writes
// 64 MiB and at the same time reads the echo, 256 KiB at a time. Both channels
// have a low-water mark of 1 byte. With the client's write on the same channel
// as its reads, some rounds never finish: every operation waits for an epoll
// wake-up libdispatch never re-arms. With the write on a second channel over
// dup(client), which is what IOChannel does for sockets, every round finishes.
//
//   make io-stall-probe            (both shapes, 12 rounds each)
//   io_socket_stall ROUNDS [split]  (exit status: the number of stalled rounds)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dispatch/dispatch.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const size_t payload_size = 64 << 20;
static const size_t chunk = 256 * 1024;
static dispatch_queue_t q;

typedef struct {
  dispatch_io_t server, client, writer;
  int server_fd, client_fd;
  atomic_size_t echoed;
  dispatch_semaphore_t finished, cleaned;
} round_t;

static void server_read(round_t *r) {
  __block dispatch_data_t received = dispatch_data_empty;
  dispatch_io_read(r->server, 0, chunk, q, ^(bool done, dispatch_data_t data, int error) {
    if (data) received = dispatch_data_create_concat(received, data);
    if (!done || error) return;
    if (dispatch_data_get_size(received) == 0) {
      shutdown(r->server_fd, SHUT_WR);
      return;
    }
    dispatch_io_write(r->server, 0, received, q, ^(bool written, dispatch_data_t rest, int failure) {
      (void)rest;
      if (written && !failure) server_read(r);
    });
  });
}

static void client_read(round_t *r) {
  __block size_t got = 0;
  dispatch_io_read(r->client, 0, chunk, q, ^(bool done, dispatch_data_t data, int error) {
    if (data) got += dispatch_data_get_size(data);
    if (!done) return;
    atomic_fetch_add(&r->echoed, got);
    if (error || got == 0) {
      dispatch_semaphore_signal(r->finished);
      return;
    }
    client_read(r);
  });
}

static dispatch_io_t channel(int fd, round_t *r) {
  dispatch_io_t io = dispatch_io_create(DISPATCH_IO_STREAM, fd, q, ^(int error) {
    (void)error;
    close(fd);
    dispatch_semaphore_signal(r->cleaned);
  });
  dispatch_io_set_low_water(io, 1);
  return io;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 12;
  int split = argc > 2 && strcmp(argv[2], "split") == 0;
  q = dispatch_queue_create("probe", NULL);
  char *bytes = malloc(payload_size);
  for (size_t i = 0; i < payload_size; i++) bytes[i] = (char)(i * 2654435761u >> 7);
  dispatch_data_t payload = dispatch_data_create(bytes, payload_size, NULL, DISPATCH_DATA_DESTRUCTOR_FREE);
  int stalled = 0;
  for (int index = 0; index < rounds; index++) {
    round_t *r = calloc(1, sizeof *r);
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t length = sizeof address;
    if (bind(listener, (struct sockaddr *)&address, length) || listen(listener, 1) ||
        getsockname(listener, (struct sockaddr *)&address, &length)) {
      perror("listener");
      return 100;
    }
    r->client_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(r->client_fd, (struct sockaddr *)&address, length)) {
      perror("connect");
      return 100;
    }
    r->server_fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    close(listener);
    r->finished = dispatch_semaphore_create(0);
    r->cleaned = dispatch_semaphore_create(0);
    r->server = channel(r->server_fd, r);
    r->client = channel(r->client_fd, r);
    r->writer = split ? channel(dup(r->client_fd), r) : r->client;
    dispatch_async(q, ^{
      server_read(r);
      dispatch_io_write(r->writer, 0, payload, q, ^(bool done, dispatch_data_t rest, int error) {
        (void)rest;
        if (done && !error) shutdown(r->client_fd, SHUT_WR);
      });
      client_read(r);
    });
    long late = dispatch_semaphore_wait(r->finished, dispatch_time(DISPATCH_TIME_NOW, 10 * NSEC_PER_SEC));
    size_t echoed = atomic_load(&r->echoed);
    if (late) {
      stalled++;
      printf("round %d: stalled after %zu of %zu bytes\n", index + 1, echoed, payload_size);
    } else if (echoed != payload_size) {
      printf("round %d: %zu of %zu bytes echoed\n", index + 1, echoed, payload_size);
      return 100;
    }
    dispatch_io_t all[] = {r->server, r->client, split ? r->writer : NULL};
    for (int i = 0; i < 3; i++) {
      if (!all[i]) continue;
      dispatch_io_close(all[i], DISPATCH_IO_STOP);
      dispatch_release(all[i]);
    }
    for (int i = 0; i < (split ? 3 : 2); i++) dispatch_semaphore_wait(r->cleaned, DISPATCH_TIME_FOREVER);
    if (late) dispatch_semaphore_wait(r->finished, DISPATCH_TIME_FOREVER);  // the stopped read's ECANCELED
    dispatch_release(r->finished);
    dispatch_release(r->cleaned);
    free(r);
  }
  printf("%s: %d of %d rounds stalled\n", split ? "reads on one channel, the write on a second over dup()"
                                            : "reads and the write on one channel", stalled, rounds);
  return stalled;
}
