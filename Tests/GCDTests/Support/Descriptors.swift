import GCD
import Glibc
import Testing

/// Polls `condition` until it holds or `timeout` passes; true if it held.
@available(*, noasync, message: "blocks the thread")
func pollUntil(timeout: Duration = generousTimeout, _ condition: () -> Bool) -> Bool {
  let deadline = ContinuousClock.now + timeout
  while !condition() {
    if ContinuousClock.now >= deadline { return false }
    usleep(2_000)
  }
  return true
}

/// For something that must NOT happen: true if it happened within the brief timeout.
@available(*, noasync, message: "blocks the thread")
func pollBriefly(_ condition: () -> Bool) -> Bool { pollUntil(timeout: briefTimeout, condition) }

/// The number of open descriptors whose target (`/proc/self/fd/N`) passes
/// `isOwned`: the descriptors a test can attribute to what it created, so
/// that descriptors the runtime or a sanitizer opens and closes meanwhile
/// do not move the count.
func openDescriptorCount(where isOwned: (String) -> Bool) -> Int {
  openDescriptorTargets().values.filter(isOwned).count
}

/// Every open descriptor of this process and what it refers to, but for the idle epoll instances
/// the package keeps for reuse (an epoll instance that watches nothing: the nests of descriptor
/// sources given back after their cancel handlers, at most `EpollNest.poolCapacity` of them,
/// tested in `NestedEpollTests`): they are not a source's, and which numbers they hold depends on
/// what ran before.
func openDescriptorTargets() -> [Int32: String] {
  allOpenDescriptorTargets().filter { !isIdleEpollInstance($0, $1) }
}

/// Whether `descriptor`, which refers to `target`, is an epoll instance that watches nothing.
private func isIdleEpollInstance(_ descriptor: Int32, _ target: String) -> Bool {
  target.contains("eventpoll") && epollTargets(of: descriptor)?.isEmpty == true
}

/// The descriptors an epoll instance watches (the `tfd:` lines of its fdinfo), in ascending order;
/// nil when the fdinfo cannot be read (the descriptor is not open).
func epollTargets(of descriptor: Int32) -> [Int32]? {
  epollInterests(of: descriptor).map { $0.keys.sorted() }
}

/// The epoll instances of this process that watch `descriptor` (the descriptor fence's, for a
/// fenced source's).
func epollInstances(watching descriptor: Int32) -> [Int32] {
  allOpenDescriptorTargets().keys.filter { (epollTargets(of: $0) ?? []).contains(descriptor) }
}

/// The interests (`events`) an epoll instance of this process holds, by target descriptor, from
/// /proc/self/fdinfo; nil when `descriptor` is not open.
func epollInterests(of descriptor: Int32) -> [Int32: UInt32]? {
  guard let file = fopen("/proc/self/fdinfo/\(descriptor)", "re") else { return nil }
  defer { fclose(file) }
  var interests: [Int32: UInt32] = [:]
  var line = [CChar](repeating: 0, count: 512)
  while fgets(&line, Int32(line.count), file) != nil {
    let text = line.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    guard text.hasPrefix("tfd:") else { continue }
    let fields = text.split(separator: " ", omittingEmptySubsequences: true)
    guard fields.count > 3, fields[2] == "events:", let target = Int32(fields[1]),
      let events = UInt32(fields[3], radix: 16)
    else { continue }
    interests[target] = events
  }
  return interests
}

/// The epoll instances of this process that watch nothing (the package's idle nests).
func idleEpollInstances() -> Set<Int32> {
  Set(allOpenDescriptorTargets().filter { isIdleEpollInstance($0, $1) }.keys)
}

/// Every open descriptor of this process and what it refers to, the idle epoll instances too.
func allOpenDescriptorTargets() -> [Int32: String] {
  guard let directory = opendir("/proc/self/fd") else { return [:] }
  defer { closedir(directory) }
  let own = dirfd(directory)
  var result: [Int32: String] = [:]
  while let entry = readdir(directory) {
    let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    guard let descriptor = Int32(name), descriptor != own else { continue }
    var buffer = [CChar](repeating: 0, count: 4096)
    let count = readlink("/proc/self/fd/\(name)", &buffer, buffer.count - 1)
    result[descriptor] =
      count >= 0 ? String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
  }
  return result
}

/// Whether two listings of `openDescriptorTargets` show the same
/// descriptors: the same numbers referring to the same things. A file
/// deleted in between still counts as the same (its link gains
/// " (deleted)"): an exit test's child inherits the parent's descriptors
/// that are not close-on-exec, files other tests create and delete among
/// them.
/// What differs between two listings, both ways: descriptors opened, closed, or now naming another
/// file (a number closed and reused), for a failure's message.
func descriptorChanges(from before: [Int32: String], to after: [Int32: String]) -> String {
  let numbers = Set(before.keys).union(after.keys).sorted()
  let changes = numbers.compactMap { number -> String? in
    switch (before[number], after[number]) {
    case (nil, let now?): "\(number) opened (\(now))"
    case (let was?, nil): "\(number) closed (was \(was))"
    case (let was?, let now?) where was != now: "\(number) was \(was), now \(now)"
    default: nil
    }
  }
  return changes.isEmpty ? "none" : changes.joined(separator: "; ")
}

func sameDescriptors(_ first: [Int32: String], _ second: [Int32: String]) -> Bool {
  func normalized(_ listing: [Int32: String]) -> [Int32: String] {
    listing.mapValues { $0.hasSuffix(" (deleted)") ? String($0.dropLast(" (deleted)".count)) : $0 }
  }
  return normalized(first) == normalized(second)
}

/// In an exit test's child: makes libdispatch open its own descriptors
/// (epoll, eventfd, timerfd) before the test counts descriptors — one read
/// source, started, fired, cancelled — so that they are in the baseline.
@available(*, noasync, message: "blocks the thread")
func warmUpDispatch() {
  var ends: [Int32] = [-1, -1]
  childRequire(pipe(&ends) == 0, "warm-up: pipe failed, errno \(errno)")
  _ = write(ends[1], "x", 1)
  guard let source = try? ReadSource(fileDescriptor: ends[0], queue: .global()) else {
    childRequire(false, "warm-up: ReadSource failed")
    return
  }
  let fired = Event()
  let cancelled = Event()
  source.setEventHandler {
    fired.signal()
    source.cancel()
  }
  source.setCancelHandler { cancelled.signal() }
  source.resume()
  requireInChild(fired, "warm-up read source")
  requireInChild(cancelled, "warm-up cancel")
  close(ends[0])
  close(ends[1])
  // libdispatch opens a timerfd per clock on the first timer of that clock, whoever arms it (the
  // testing library's child, a task's sleep): one timer on each clock, fired, so that they are in
  // the baseline too (without this, `droppedReadSequencesCloseDescriptors` saw one appear in 2 of
  // 30 runs beside a full suite).
  for deadline in [Deadline.now + .milliseconds(1), Deadline.wallClock() + .milliseconds(1)] {
    let timerFired = Event()
    let timer = TimerSource(queue: .global())
    timer.schedule(start: deadline)
    timer.setEventHandler { timerFired.signal() }
    timer.resume()
    requireInChild(timerFired, "warm-up timer")
    timer.cancel()
  }
  let slept = Event()
  Task.detached {
    try? await Task.sleep(for: .milliseconds(1), clock: .continuous)
    try? await Task.sleep(for: .milliseconds(1), clock: .suspending)
    slept.signal()
  }
  requireInChild(slept, "warm-up sleeps")
}

/// The number of kernel watches on the process's inotify instance (from its
/// fdinfo); 0 when there is no instance, -1 when its fdinfo cannot be read.
func inotifyWatchCount() -> Int {
  guard let (descriptor, _) = openDescriptorTargets().first(where: { $0.value.contains("inotify") }) else { return 0 }
  guard let file = fopen("/proc/self/fdinfo/\(descriptor)", "re") else { return -1 }
  defer { fclose(file) }
  var count = 0
  var line = [CChar](repeating: 0, count: 512)
  while fgets(&line, Int32(line.count), file) != nil {
    if line.withUnsafeBufferPointer({ String(cString: $0.baseAddress!) }).hasPrefix("inotify wd:") { count += 1 }
  }
  return count
}
