// Reproduces "Using Dispatch Semaphores to Regulate the Use of Finite Resources":
// `fd_sema = dispatch_semaphore_create(getdtablesize() / 2)`, then in each task
// `dispatch_semaphore_wait(fd_sema, DISPATCH_TIME_FOREVER)`, `fd = open("/etc/services", O_RDONLY)`,
// `close(fd)`, `dispatch_semaphore_signal(fd_sema)`.
//
// On Linux: the same calls. `getdtablesize()` is the RLIMIT_NOFILE soft limit, often thousands, so half
// of it would never be reached here; the example prints it and uses a small limit (an argument). The
// tasks run on serial queues of their own so that more of them run at once than the limit allows.
//
// Usage: ExampleSemaphore [limit, default 4] [tasks, default 24]

import GCD
import Glibc
import Synchronization

let arguments = CommandLine.arguments.dropFirst().compactMap { Int($0) }
let limit = arguments.count > 0 ? max(arguments[0], 1) : 4
let taskCount = arguments.count > 1 ? max(arguments[1], 0) : 24
let path = access("/etc/services", R_OK) == 0 ? "/etc/services" : "/etc/passwd"

func openDescriptors() -> Int {
  guard let dir = opendir("/proc/self/fd") else { return -1 }
  defer { closedir(dir) }
  var count = 0
  while let entry = readdir(dir) {
    if entry.pointee.d_name.0 != UInt8(ascii: ".") { count += 1 }
  }
  return count - 1  // the descriptor of the directory listing itself
}

print("getdtablesize() / 2 = \(getdtablesize() / 2): the listing's limit; this run uses \(limit)")

// Create the semaphore, specifying the initial pool size.
let fd_sema = try Semaphore(value: limit)

let openNow = Atomic<Int>(0)
let peak = Atomic<Int>(0)
let bytesRead = Atomic<Int>(0)
let failures = Atomic<Int>(0)
let descriptorsBefore = openDescriptors()

let group = Group()
// Each task on a serial queue of its own: queues run concurrently with respect to each other, so up to
// `taskCount` tasks compete for `limit` descriptors.
let queues = (0..<taskCount).map { Queue(label: "com.example.Reader\($0)") }
for queue in queues {
  group.async(on: queue) {
    // Wait for a free file descriptor.
    fd_sema.wait()
    let fd = open(path, O_RDONLY)
    if fd < 0 {
      failures.add(1, ordering: .relaxed)
    } else {
      let now = openNow.add(1, ordering: .relaxed).newValue
      peak.max(now, ordering: .relaxed)
      var buffer = [UInt8](repeating: 0, count: 4096)
      bytesRead.add(read(fd, &buffer, buffer.count), ordering: .relaxed)
      usleep(10_000)  // hold the descriptor a while, as real work would
      openNow.subtract(1, ordering: .relaxed)
      // Release the file descriptor when done.
      close(fd)
    }
    fd_sema.signal()
  }
}
group.wait()

print("\(taskCount) tasks opened \(path) and read \(bytesRead.load(ordering: .relaxed)) bytes in all")
print("open failures: \(failures.load(ordering: .relaxed))")
print("peak open files: \(peak.load(ordering: .relaxed)) (limit \(limit))")
print("never more than the limit: \(peak.load(ordering: .relaxed) <= limit)")
print("descriptors leaked: \(openDescriptors() - descriptorsBefore)")
