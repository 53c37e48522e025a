// Reproduces "Using Dispatch Semaphores to Regulate the Use of Finite Resources":
// `fd_sema = dispatch_semaphore_create(getdtablesize() / 2)`; each task waits on it (FOREVER),
// `open("/etc/services", O_RDONLY)`, uses the file, `close(fd)`, and signals it.
//
// On Linux: the same calls. `getdtablesize()` is the RLIMIT_NOFILE soft limit (thousands), which a short
// run never reaches, so the limit is an argument. Each task runs on a serial queue of its own, so that
// more of them run at once than the limit lets open a file.
//
// Usage: ExampleSemaphore [limit, default 4] [tasks, default 24]

import GCD
import Glibc
import Synchronization

let arguments = CommandLine.arguments.dropFirst().compactMap { Int($0) }
let limit = arguments.first ?? 4
let taskCount = arguments.dropFirst().first ?? 24
let path = access("/etc/services", R_OK) == 0 ? "/etc/services" : "/etc/passwd"
print("getdtablesize() / 2 = \(getdtablesize() / 2); this run lets \(limit) tasks have the file open at once")

// Create the semaphore, specifying the initial pool size
let fd_sema = try Semaphore(value: limit)
let openNow = Atomic<Int>(0)
let peak = Atomic<Int>(0)
let opened = Atomic<Int>(0)

let group = Group()
for task in 1...taskCount {
  group.async(on: Queue(label: "com.example.Task\(task)")) {
    // Wait for a free file descriptor
    fd_sema.wait()
    let fd = open(path, O_RDONLY)
    if fd >= 0 {
      opened.add(1, ordering: .relaxed)
      peak.max(openNow.add(1, ordering: .relaxed).newValue, ordering: .relaxed)
      usleep(10_000)  // use the file a while
      openNow.subtract(1, ordering: .relaxed)
      // Release the file descriptor when done
      close(fd)
    }
    fd_sema.signal()
  }
}
group.wait()
print("\(opened.load(ordering: .relaxed)) of \(taskCount) tasks opened \(path)")
print("peak: \(peak.load(ordering: .relaxed)) files open at once (limit \(limit))")
