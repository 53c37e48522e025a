import Dispatch
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Memory: what each live object costs on the heap, what the Swift wrapper
// objects themselves take, and the peak RSS of allocation-heavy workloads.
//
// Method. `mallinfo2()` (called in bench_c.c: Swift's Glibc module does
// not import <malloc.h>, so without the C library there are no memory
// figures) sums the bytes in use in every malloc arena (and
// in mmap'd chunks); its growth while `count` objects are created and kept
// alive, divided by `count`, is the heap cost of one object with everything
// it allocates (the C object, the wrapper, labels, closure contexts). Swift
// allocates class instances with malloc (`swift_slowAlloc`), so
// `malloc_usable_size` of an instance's address (`Unmanaged.toOpaque`) is
// the size of the wrapper object itself, rounded up to malloc's size class.
// Peak RSS is the high-water mark (`VmHWM`) of a fresh child process (this
// executable re-launched with `--rss-child`), before and after the
// workload, so the variants do not inherit each other's heap.

/// The objects of the memory tables; the raw values are bench_c.c's kinds.
enum ObjectKind: Int, CaseIterable {
  case queue, group, semaphore, timer, read, write, signal, dataAdd, dataOr, dataReplace, proc, fileSystem

  var name: String {
    switch self {
    case .queue: "queue"
    case .group: "group"
    case .semaphore: "semaphore"
    case .timer: "timer_source"
    case .read: "read_source"
    case .write: "write_source"
    case .signal: "signal_source"
    case .dataAdd: "data_add_source"
    case .dataOr: "data_or_source"
    case .dataReplace: "data_replace_source"
    case .proc: "proc_source"
    case .fileSystem: "filesystem_source"
    }
  }

  var onlyGCD: Bool { self == .proc || self == .fileSystem }
  var isSource: Bool { rawValue >= ObjectKind.timer.rawValue }
}

/// Creates, holds and releases objects of one kind in one variant.
struct ObjectFactory {
  let library: CLibrary?
  let fixtures: SourceFixtures
  let queue: Queue
  let dispatchQueue: DispatchQueue

  /// Creates `count` objects of `kind` in `variant` (sources created, not
  /// resumed), calls `body` with one of them while all are alive, then
  /// releases them. False when the variant has no such object.
  func withLiveObjects(
    _ kind: ObjectKind, _ variant: Variant, count: Int, _ body: (AnyObject?) -> Void
  ) -> Bool {
    switch variant {
    case .c:
      guard !kind.onlyGCD, let library, let make = library.make, let free = library.free else { return false }
      var objects = [UnsafeMutableRawPointer?](repeating: nil, count: count)
      let handle: Int32 =
        switch kind {
        case .read: fixtures.readEnd
        case .write: fixtures.writeEnd
        case .signal: fixtures.signal
        default: 0
        }
      let target = UnsafeMutableRawPointer(queue.unsafeObject)
      for index in 0..<count { objects[index] = make(Int64(kind.rawValue), Int64(handle), target) }
      body(nil)
      for object in objects { free(Int64(kind.rawValue), object) }
    case .gcd:
      var objects: [AnyObject] = []
      objects.reserveCapacity(count)
      for _ in 0..<count { objects.append(gcdObject(kind)) }
      body(objects.first)
      objects.removeAll()
    case .dispatch:
      guard !kind.onlyGCD else { return false }
      var objects: [AnyObject] = []
      objects.reserveCapacity(count)
      for _ in 0..<count { objects.append(dispatchObject(kind)) }
      body(objects.first)
      for object in objects {
        // libdispatch traps on the release of a source that never ran.
        if let source = object as? DispatchSource {
          source.resume()
          source.cancel()
        }
      }
      objects.removeAll()
    }
    return true
  }

  /// Waits until the heap stops shrinking: libdispatch frees cancelled
  /// sources and released queues later, on its own threads.
  func settle(_ heapInUse: () -> Int) {
    var last = heapInUse()
    for _ in 0..<100 {
      queue.sync {}
      dispatchQueue.sync {}
      usleep(2_000)
      let now = heapInUse()
      if now == last { return }
      last = now
    }
  }

  func gcdObject(_ kind: ObjectKind) -> AnyObject {
    switch kind {
    case .queue: Queue(label: "bench.queue")
    case .group: Group()
    case .semaphore: try! Semaphore(value: 0)
    case .timer: TimerSource(queue: queue)
    case .read: try! ReadSource(fileDescriptor: fixtures.readEnd, queue: queue)
    case .write: try! WriteSource(fileDescriptor: fixtures.writeEnd, queue: queue)
    case .signal: try! SignalSource(signal: fixtures.signal, queue: queue)
    case .dataAdd: DataAddSource(queue: queue)
    case .dataOr: DataOrSource(queue: queue)
    case .dataReplace: DataReplaceSource(queue: queue)
    case .proc: try! ProcSource(pid: getpid(), queue: queue)
    case .fileSystem: try! FileSystemSource(path: fixtures.watchedPath, events: .write, queue: queue)
    }
  }

  func dispatchObject(_ kind: ObjectKind) -> AnyObject {
    let queue = dispatchQueue
    return switch kind {
    case .queue: DispatchQueue(label: "bench.queue")
    case .group: DispatchGroup()
    case .semaphore: DispatchSemaphore(value: 0)
    case .timer: DispatchSource.makeTimerSource(queue: queue) as AnyObject
    case .read: DispatchSource.makeReadSource(fileDescriptor: fixtures.readEnd, queue: queue) as AnyObject
    case .write: DispatchSource.makeWriteSource(fileDescriptor: fixtures.writeEnd, queue: queue) as AnyObject
    case .signal: DispatchSource.makeSignalSource(signal: fixtures.signal, queue: queue) as AnyObject
    case .dataAdd: DispatchSource.makeUserDataAddSource(queue: queue) as AnyObject
    case .dataOr: DispatchSource.makeUserDataOrSource(queue: queue) as AnyObject
    case .dataReplace: DispatchSource.makeUserDataReplaceSource(queue: queue) as AnyObject
    case .proc, .fileSystem: fatalError("no \(kind.name) in Dispatch on Linux")
    }
  }
}

/// The size of the Swift wrapper objects of one live object (0 for C).
func wrapperSize(_ object: AnyObject?, variant: Variant, library: CLibrary) -> Int? {
  guard let object, let usableSize = library.usableSize else { return variant == .c ? 0 : nil }
  func size(_ object: AnyObject) -> Int { usableSize(Unmanaged.passUnretained(object).toOpaque()) }
  // A source is one object (its class derives from Source); the
  // handlers box it makes once closure handlers are set is not counted here
  // (the objects measured have none).
  return size(object)
}

struct ObjectMemory {
  let kind: ObjectKind
  /// Heap bytes per live object, by variant (nil: no such object).
  var heap: [Variant: Double] = [:]
  /// Bytes of the Swift wrapper objects, by variant.
  var wrapper: [Variant: Int] = [:]
}

/// Heap cost per live object of every kind in every variant.
func measureObjects(_ factory: ObjectFactory, kinds: [ObjectKind], variants: [Variant], count: Int)
  -> [ObjectMemory]
{
  guard let library = factory.library, let heapInUse = library.heapInUse else { return [] }
  return kinds.map { kind in
    var row = ObjectMemory(kind: kind)
    for variant in variants {
      // Each proc and file-system source holds descriptors: stay far below the descriptor limit.
      let count = kind.onlyGCD ? min(count, 200) : count
      var samples: [Double] = []
      // Three rounds, the smallest growth kept: a round may also pay for
      // libdispatch's lazily grown caches.
      for _ in 0..<3 {
        factory.settle(heapInUse)
        let before = heapInUse()
        var after = before
        let made = factory.withLiveObjects(kind, variant, count: count) { object in
          after = heapInUse()
          if let size = wrapperSize(object, variant: variant, library: library) { row.wrapper[variant] = size }
        }
        guard made else { break }
        samples.append(Double(after - before) / Double(count))
      }
      if let smallest = samples.min() { row.heap[variant] = smallest }
    }
    return row
  }
}

// MARK: - Peak RSS

/// The allocation-heavy workloads whose peak RSS is measured per variant.
enum RSSWorkload: String, CaseIterable {
  /// Closures queued on a suspended serial queue, then run.
  case queued
  /// Serial queues alive at once.
  case queues
  /// DATA_ADD sources alive at once.
  case sources

  var count: Int {
    switch self {
    case .queued: 200_000
    case .queues: 20_000
    case .sources: 20_000
    }
  }

  var title: String {
    switch self {
    case .queued: "closures queued on a suspended queue"
    case .queues: "serial queues alive at once"
    case .sources: "DATA_ADD sources alive at once"
    }
  }
}

/// Runs `workload` in this process (the `--rss-child` side) and returns
/// the peak RSS (KiB) before and after.
func runRSSWorkload(_ workload: RSSWorkload, variant: Variant, count: Int, factory: ObjectFactory) -> (Int, Int)? {
  let before = maxRSS()
  switch workload {
  case .queued:
    switch variant {
    case .c:
      guard let function = factory.library?.timed("rss_queued") else { return nil }
      _ = function(Int64(count), nil)
    case .gcd:
      let queue = Queue(label: "bench.rss")
      let counter = Counter()
      queue.suspend()
      for _ in 0..<count { queue.async { counter.value &+= 1 } }
      queue.resume()
      queue.sync {}
      check(counter.value == count, "GCD rss count")
    case .dispatch:
      let queue = DispatchQueue(label: "bench.rss")
      let counter = Counter()
      queue.suspend()
      for _ in 0..<count { queue.async { counter.value &+= 1 } }
      queue.resume()
      queue.sync {}
      check(counter.value == count, "Dispatch rss count")
    }
  case .queues:
    guard factory.withLiveObjects(.queue, variant, count: count, { _ in }) else { return nil }
  case .sources:
    guard factory.withLiveObjects(.dataAdd, variant, count: count, { _ in }) else { return nil }
  }
  return (before, maxRSS())
}

/// The peak resident set size of this process in KiB: `VmHWM` in
/// /proc/self/status, the high-water mark of this process's own memory
/// map. (`ru_maxrss` would not do: the kernel carries the parent's peak
/// over into a child that posix_spawn starts with a shared memory map.)
func maxRSS() -> Int {
  guard let file = fopen("/proc/self/status", "r") else { return 0 }
  defer { fclose(file) }
  var line = [CChar](repeating: 0, count: 256)
  while fgets(&line, Int32(line.count), file) != nil {
    let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    if text.hasPrefix("VmHWM:") {
      return Int(text.dropFirst(6).filter { $0.isNumber }) ?? 0
    }
  }
  return 0
}

struct RSSResult {
  let workload: RSSWorkload
  let count: Int
  /// Peak RSS growth in KiB, by variant.
  var growth: [Variant: Int] = [:]
  var unavailable: [Variant: String] = [:]
}

/// Launches this executable with `arguments` and returns its standard output.
func runChild(_ arguments: [String]) -> String? {
  var buffer = [CChar](repeating: 0, count: 4096)
  let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
  guard length > 0 else { return nil }
  let executable = String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
  var ends: [Int32] = [0, 0]
  guard pipe(&ends) == 0 else { return nil }
  var actions = posix_spawn_file_actions_t()
  posix_spawn_file_actions_init(&actions)
  defer { posix_spawn_file_actions_destroy(&actions) }
  posix_spawn_file_actions_adddup2(&actions, ends[1], 1)
  posix_spawn_file_actions_addclose(&actions, ends[0])
  var argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
  defer { for argument in argv { Glibc.free(argument) } }
  var pid: pid_t = 0
  let spawned = posix_spawn(&pid, executable, &actions, nil, &argv, environ)
  close(ends[1])
  defer { close(ends[0]) }
  guard spawned == 0 else { return nil }
  var output: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 4096)
  while true {
    let count = read(ends[0], &chunk, chunk.count)
    if count < 0 && errno == EINTR { continue }
    if count <= 0 { break }
    output += chunk[0..<count]
  }
  var status: Int32 = 0
  while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
  guard status == 0 else { return nil }
  return String(decoding: output, as: UTF8.self)
}

/// Peak RSS growth of every workload in every variant, each in a fresh child.
func measureRSS(workloads: [RSSWorkload], variants: [Variant], quick: Bool, libraryPath: String?) -> [RSSResult] {
  workloads.map { workload in
    let count = quick ? 100 : workload.count
    var result = RSSResult(workload: workload, count: count)
    for variant in variants {
      var arguments = ["--rss-child", workload.rawValue, variant.rawValue, String(count)]
      if let libraryPath { arguments += ["--c-lib", libraryPath] }
      guard let output = runChild(arguments) else {
        result.unavailable[variant] = variant == .c && libraryPath == nil ? CLibrary.missing : "child failed"
        continue
      }
      let fields = parseFields(output)
      if let before = fields["before_kib"].flatMap({ Int($0) }), let after = fields["after_kib"].flatMap({ Int($0) }) {
        result.growth[variant] = after - before
      } else {
        result.unavailable[variant] = fields["status"] ?? "child failed"
      }
    }
    return result
  }
}

/// `key=value` fields of a line.
func parseFields(_ text: String) -> [String: String] {
  var fields: [String: String] = [:]
  for word in text.split(whereSeparator: { $0 == " " || $0 == "\n" }) {
    let parts = word.split(separator: "=", maxSplits: 1)
    if parts.count == 2 { fields[String(parts[0])] = String(parts[1]) }
  }
  return fields
}
