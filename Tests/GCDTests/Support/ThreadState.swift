#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The calling thread's kernel thread id (`gettid`, which Glibc does not
/// export to Swift), read from the `/proc/thread-self` link ("pid/task/tid").
func currentThreadID() -> pid_t {
  var buffer = [CChar](repeating: 0, count: 64)
  let count = readlink("/proc/thread-self", &buffer, buffer.count - 1)
  guard count > 0 else { return 0 }
  let target = String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
  return target.split(separator: "/").last.flatMap { pid_t($0) } ?? 0
}

/// The scheduler state of a thread of this process, from
/// `/proc/self/task/<tid>/stat`: "R" running, "S" sleeping (blocked in a
/// futex, for instance), and so on; nil if it cannot be read.
func schedulerState(ofThread thread: pid_t) -> Character? {
  let descriptor = open("/proc/self/task/\(thread)/stat", O_RDONLY | O_CLOEXEC)
  guard descriptor >= 0 else { return nil }
  defer { close(descriptor) }
  var buffer = [UInt8](repeating: 0, count: 512)
  let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
  guard count > 0 else { return nil }
  // "tid (name) S ...": the name may contain spaces and parentheses, so
  // the state follows the last ')'.
  let text = String(decoding: buffer[..<count], as: UTF8.self)
  guard let close = text.lastIndex(of: ")") else { return nil }
  return text[text.index(after: close)...].first { $0 != " " }
}

/// Waits (polling, up to the generous timeout) until `thread` is blocked in
/// the kernel.
///
/// - Returns: true if the thread was seen sleeping.
@available(*, noasync, message: "blocks the thread")
func waitUntilBlocked(thread: pid_t, timeout: Duration = generousTimeout) -> Bool {
  let clock = ContinuousClock()
  let deadline = clock.now + timeout
  while clock.now < deadline {
    if schedulerState(ofThread: thread) == "S" { return true }
    sched_yield()
  }
  return false
}

/// Runs `body` on a thread made for it (not libdispatch's pool, not the cooperative pool) and
/// returns its result once it has ended: for seconds of CPU work that would otherwise hold one of
/// the two pool threads this machine has, which the other tests' queues and tasks need.
func onThreadOfItsOwn<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
  await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
    let work = Unmanaged.passRetained(ThreadWork { continuation.resume(returning: body()) }).toOpaque()
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
    // The model's breadth-first search recurses little, but keep libdispatch's 512 KiB at least.
    pthread_attr_setstacksize(&attributes, 8 << 20)
    var thread = pthread_t()
    let created = pthread_create(
      &thread, &attributes,
      { context in
        Unmanaged<ThreadWork>.fromOpaque(context!).takeRetainedValue().run()
        return nil
      }, work)
    pthread_attr_destroy(&attributes)
    precondition(created == 0, "pthread_create: \(created)")
  }
}

/// The body of `onThreadOfItsOwn`, handed to the new thread once, by `pthread_create`.
private final class ThreadWork: Sendable {
  let run: @Sendable () -> Void
  init(_ run: @escaping @Sendable () -> Void) { self.run = run }
}
