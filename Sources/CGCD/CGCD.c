#include "CGCD.h"

#include <sys/syscall.h>
#include <unistd.h>

_Thread_local cgcd_frame_t *cgcd_current_frame = NULL;

const char cgcd_target_key_storage = 0;

int cgcd_is_main_thread(void) { return (pid_t)syscall(SYS_gettid) == getpid(); }
