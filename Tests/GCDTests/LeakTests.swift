import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Creates and drops 20,000 objects of every wrapper type, in every state
/// a drop can find them in, with handlers that capture objects, and checks
/// that nothing stays behind: every finalizer runs, every captured object
/// is released, the process holds the same descriptors as before and its
/// resident memory does not grow beyond a small bound.
///
/// It runs in a child process (an exit test) so that no other test opens
/// descriptors or allocates memory while it counts.
@Suite("Leaks")
struct LeakTests {
  @Test("20,000 of each wrapper created and dropped: all finalized, captures released, same descriptors, flat RSS")
  func createAndDropEveryWrapper() async {
    await #expect(processExitsWith: .success) {
      churnEveryWrapper()
    }
  }
}

// MARK: - The child

/// Objects per wrapper type and round: 20,000, except 4,000
/// FileSystemSources, each of which costs seven system calls (open, fstat,
/// readlink, inotify_add_watch, inotify_rm_watch, the read of its
/// IN_IGNORED event, close: 50 µs). Ten times fewer under a sanitizer, which
/// makes every allocation and every dispatch call several times slower.
///
/// The child runs about 8 s (debug build, 2 cores). It was 100,000 per type
/// (35 s) until the descriptor sources' nested epoll made them three times
/// dearer; an exit test's child that long stalls the whole parallel suite,
/// because the testing library reads the child's pipes with blocking reads
/// on the parent's cooperative threads (two of them on 2 cores), and the
/// pressure tests' 60 s time limits ran out behind it.
private func objectsPerRound(_ type: Churned) -> Int {
  let count = if case .source(.fileSystem) = type { 4_000 } else { 20_000 }
  return runningUnderSanitizer ? count / 10 : count
}

/// How much the resident set may grow over the measured round (224,000
/// objects, after a warm-up round of as many): 16 MiB, 75 bytes per object,
/// while a leaked source alone is 120 bytes — a leak in every source
/// exceeds it. The measured round adds 5 to 6 MiB (measured: allocator
/// slack of malloc's per-thread arenas, as large at this size as at five
/// times it). The exact checks — every finalizer called, every capture
/// released, the same descriptors and no inotify watch — are the leak
/// detectors; the resident set is the net for what none of them sees.
/// Not checked under a sanitizer: ASan keeps freed memory in quarantine, and
/// its leak checker covers leaks there.
private let residentGrowthBound = 16 << 20

/// Finalizer calls, counted by `countFinalizer`, whose context is only a
/// non-nil marker (libdispatch calls a finalizer only with a context).
private let finalized = Atomic<Int>(0)
private let finalizerMarkerAddress: UInt = 0x600D
private var finalizerMarker: UnsafeMutableRawPointer? { UnsafeMutableRawPointer(bitPattern: finalizerMarkerAddress) }

private func countFinalizer(_ context: UnsafeMutableRawPointer?) {
  if context == finalizerMarker { finalized.add(1, ordering: .relaxed) }
}

/// Captured by handlers and work items; counts its deinits.
private final class Capture: Sendable {
  static let released = Atomic<Int>(0)
  deinit { Capture.released.add(1, ordering: .relaxed) }
}

/// The wrapper types, sources by kind.
private enum Churned: CustomStringConvertible {
  case queue, group, semaphore
  case source(SourceKind)

  static var all: [Churned] { [.queue, .group, .semaphore] + SourceKind.allCases.map { .source($0) } }

  var description: String {
    switch self {
    case .queue: "Queue"
    case .group: "Group"
    case .semaphore: "Semaphore"
    case .source(let kind): kind.typeName
    }
  }
}

/// What the sources share: descriptors and a process to watch, a file.
private struct Shared {
  let pipe: (read: Int32, write: Int32)
  let runningChild: pid_t
  let file: String
  let queue = Queue(label: "leaks.handlers")
}

private func churnEveryWrapper() -> Never {
  markEveryDescriptorCloseOnExec()
  warmUpDispatch()
  _ = SourceKind.ignoreSIGUSR2
  let runningChild = (try? spawnProcess("/bin/sleep", ["600"])) ?? -1
  requireInChild(runningChild > 0, "spawn failed")
  killAtExit(runningChild)
  let shared = Shared(pipe: makePipe(), runningChild: runningChild, file: temporaryFile(containing: []))

  // The warm-up round creates what lives as long as the process (the inotify
  // instance, libdispatch's descriptors and caches) and lets malloc's arenas
  // reach their working size.
  for type in Churned.all {
    churn(type, count: runningUnderSanitizer ? 1_000 : objectsPerRound(type), shared: shared)
  }
  let descriptors = openDescriptorTargets()
  _ = mallocTrim(0)
  let residentBefore = residentBytes()

  var times: [String] = []
  for type in Churned.all {
    let start = ContinuousClock.now
    churn(type, count: objectsPerRound(type), shared: shared)
    times.append("\(type) \(objectsPerRound(type)) in \(ContinuousClock.now - start)")
  }

  requireInChild(
    pollUntil { sameDescriptors(openDescriptorTargets(), descriptors) },
    "descriptors before: \(descriptors.sorted { $0.key < $1.key }), after: "
      + "\(openDescriptorTargets().sorted { $0.key < $1.key })")
  requireInChild(pollUntil { inotifyWatchCount() == 0 }, "\(inotifyWatchCount()) inotify watches left")
  _ = mallocTrim(0)
  let residentAfter = residentBytes()
  let rss = "RSS \(residentBefore >> 10) KiB -> \(residentAfter >> 10) KiB"
  if !runningUnderSanitizer {
    requireInChild(
      residentAfter - residentBefore < residentGrowthBound,
      "\(rss), more than \(residentGrowthBound >> 10) KiB more; " + times.joined(separator: ", "))
  }
  unlink(shared.file)
  exit(0)
}

/// Creates and drops `count` objects of `type`, in turn in each state it
/// can be dropped in, and checks that every one is finalized and every
/// captured object released. It waits for each batch to be disposed of
/// before it starts the next: libdispatch disposes of objects
/// asynchronously, and without the wait the number pending — and so the
/// memory high-water mark — would depend on how far creation ran ahead.
private func churn(_ type: Churned, count: Int, shared: Shared) {
  let batch = 1_000
  let finalizedBefore = finalized.load(ordering: .relaxed)
  let releasedBefore = Capture.released.load(ordering: .relaxed)
  var created = 0
  var captures = 0
  while created < count {
    for _ in 0..<min(batch, count - created) {
      captures += makeAndDrop(type, state: created % 4, shared: shared)
      created += 1
    }
    requireInChild(
      pollUntil { finalized.load(ordering: .relaxed) - finalizedBefore == created },
      "\(type): \(finalized.load(ordering: .relaxed) - finalizedBefore) of \(created) finalized")
    requireInChild(
      pollUntil { Capture.released.load(ordering: .relaxed) - releasedBefore == captures },
      "\(type): \(Capture.released.load(ordering: .relaxed) - releasedBefore) of \(captures) captured objects released")
  }
}

/// One object of `type` in state `state` (0...3), dropped on return;
/// returns how many `Capture`s it was given.
private func makeAndDrop(_ type: Churned, state: Int, shared: Shared) -> Int {
  switch type {
  case .queue:
    // Active; suspended; created inactive; targeting another queue. Each
    // with a work item capturing an object, which runs after the drop.
    let queue = Queue(
      label: "leaks.queue", target: state == 3 ? shared.queue : nil, initiallyInactive: state == 2)
    queue.context = finalizerMarker
    queue.setFinalizer(countFinalizer)
    if state == 1 { queue.suspend() }
    let capture = Capture()
    queue.async { _ = capture }
    return 1
  case .group:
    // Empty; with an unmatched enter(); with async work; with a notify.
    let group = Group()
    group.context = finalizerMarker
    group.setFinalizer(countFinalizer)
    let capture = Capture()
    switch state {
    case 0: break
    case 1: group.enter()
    case 2: group.async(on: shared.queue) { _ = capture }
    default:
      group.enter()
      group.notify(on: shared.queue) { _ = capture }
    }
    return 1
  case .semaphore:
    // At its starting value; below it; above it; at zero.
    let semaphore = try! Semaphore(value: state == 3 ? 0 : 2)
    semaphore.context = finalizerMarker
    semaphore.setFinalizer(countFinalizer)
    if state == 1 { _ = semaphore.wait(timeout: .zero) }
    if state == 2 { semaphore.signal() }
    return 0
  case .source(let kind):
    // Never started; running; cancelled; suspended.
    let source = makeSharedSource(kind, shared: shared)
    source.context = finalizerMarker
    source.setFinalizer(countFinalizer)
    let onEvent = Capture()
    let onCancel = Capture()
    source.setEventHandler { _ = onEvent }
    source.setCancelHandler { _ = onCancel }
    switch state {
    case 0: break
    case 1: source.resume()
    case 2:
      source.resume()
      source.cancel()
    default:
      source.resume()
      source.suspend()
    }
    return 2
  }
}

/// A source of `kind` on the shared descriptors, process and file.
private func makeSharedSource(_ kind: SourceKind, shared: Shared) -> Source {
  switch kind {
  case .timer:
    let timer = TimerSource(queue: shared.queue)
    timer.schedule(start: .now + .seconds(3600), interval: .seconds(3600))
    return timer
  case .read: return try! ReadSource(fileDescriptor: shared.pipe.read, queue: shared.queue)
  case .write: return try! WriteSource(fileDescriptor: shared.pipe.write, queue: shared.queue)
  case .signal: return try! SignalSource(signal: SIGUSR2, queue: shared.queue)
  case .dataAdd: return DataAddSource(queue: shared.queue)
  case .dataOr: return DataOrSource(queue: shared.queue)
  case .dataReplace: return DataReplaceSource(queue: shared.queue)
  case .proc: return try! ProcSource(pid: shared.runningChild, queue: shared.queue)
  case .fileSystem: return try! FileSystemSource(path: shared.file, events: [.write, .delete], queue: shared.queue)
  }
}

/// The resident set size of this process, from /proc/self/statm.
private func residentBytes() -> Int {
  guard let file = fopen("/proc/self/statm", "re") else { return 0 }
  defer { fclose(file) }
  var line = [CChar](repeating: 0, count: 128)
  guard fgets(&line, Int32(line.count), file) != nil else { return 0 }
  let fields = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    .split(separator: " ")
  guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
  return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// glibc's `malloc_trim`, which returns free heap pages to the system so
/// that the resident set counts what is in use (malloc.h is not part of the
/// Glibc module).
private func mallocTrim(_ pad: Int) -> Int32 {
  guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "malloc_trim") else { return 0 }
  return unsafeBitCast(symbol, to: (@convention(c) (Int) -> Int32).self)(pad)
}
