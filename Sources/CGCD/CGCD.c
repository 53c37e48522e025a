#include "CGCD.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

_Thread_local cgcd_frame_t *cgcd_current_frame = NULL;

const char cgcd_target_key_storage = 0;

// The main thread's id, cached per thread: gettid is a system call.
static _Thread_local int cgcd_thread_is_main = -1;

int cgcd_is_main_thread(void) {
  if (cgcd_thread_is_main < 0) {
    cgcd_thread_is_main = (pid_t)syscall(SYS_gettid) == getpid();
  }
  return cgcd_thread_is_main;
}

int cgcd_pidfd_open(int pid, unsigned int flags) { return (int)syscall(SYS_pidfd_open, pid, flags); }
