import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

extension PressureTests {
  /// `MemoryPressureSource` on Linux: Darwin's levels from two PSI triggers,
  /// `.normal` after a quiet window; real pressure from a child whose memory
  /// cgroup is half the size of the file mapping it keeps reading.
  @Suite
  struct MemoryPressureSourceTests {
    // Needs PSI, root (cgroups), the cgroup v1 memory controller (the limit) and a
    // disk-backed directory for the file (a tmpfs page is reclaimed only to swap: the
    // child would be OOM-killed); skipped otherwise, never passed. With a
    // cgroup v2 hierarchy the child is also put in a v2 cgroup and the source
    // watches that cgroup alone, so other load on the machine does not count.
    @Test(
      "a child in a 48 MiB memory cgroup reading a 96 MiB file mapping makes .warning, then .normal once it stops",
      .enabled(if: canMakeMemoryPressure, needsMemoryPressure), .timeLimit(.minutes(1)))
    func warningThenNormal() async throws {
      let limited = try TestCgroup(under: memoryCgroupV1Mount!, settings: [("memory.limit_in_bytes", "\(48 << 20)")])
      defer { limited.remove() }
      let counted = try unifiedCgroupMount.map { try TestCgroup(under: $0) }
      defer { counted?.remove() }
      let file = diskBackedTemporaryDirectory! + "/gcd-pressure-\(getpid())"
      try makeSparseFile(file, size: 96 << 20)
      defer { unlink(file) }
      let scope = counted.map { PressureScope.cgroup($0.path) } ?? .system
      let source = try MemoryPressureSource(events: .all, scope: scope, queue: Queue(label: "memory pressure"))
      #expect(source.scope == scope)
      #expect(source.watchedEvents == .all)
      #expect(source.mask == MemoryPressureEvents.all.rawValue)
      let levels = Recorder<MemoryPressureEvents>()
      let pressed = Event()
      let relieved = Event()
      defer { source.cancel() }
      source.setEventHandler { [unowned source] in
        let level = source.firedEvents
        levels.append(level)
        if level == .normal { relieved.signal() } else { pressed.signal() }
      }
      source.resume()
      // A second source, cancelled by its first event: while the level is up, its timer runs.
      let early = try MemoryPressureSource(scope: scope, queue: Queue(label: "early"))
      let earlyCancelled = Event()
      early.setEventHandler { [unowned early] in early.cancel() }
      early.setCancelHandler { earlyCancelled.signal() }
      early.resume()
      // Both on CPU 0 (when taskset is there): PSI's states are per CPU, and a CPU counts as "full"
      // while no task there makes progress, or while the task on it is reclaiming. Once it has the
      // mapping the child is at nice 19 beside a busy loop at 0, so it holds the CPU about 1.5 % of
      // the time: it stalls nearly all the time (waiting for the CPU inside reclaim counts) but is
      // seldom on the CPU in reclaim. Measured: `some` 600-900 ms a second, `full` about 6 (the
      // critical level needs 100); at nice 0 beside the busy loop `full` was 235.
      let pin = "{ command -v taskset > /dev/null && taskset -pc 0 $$ > /dev/null; }; "
      let child = try spawnMappingReader(
        in: [limited] + (counted.map { [$0] } ?? []), of: file, after: pin, niceOnceMapped: 19)
      defer { killAndReap(child) }
      // The busy loop beside it in the counted cgroup never waits for memory, so not every task there
      // stalls at once: `full` stays low and the level is `.warning`, not `.critical`.
      let busy = try counted.map { try spawnInCgroups([$0], pin + "while :; do :; done") }
      defer { if let busy { killAndReap(busy) } }
      // The waits here are awaited, not blocking: the test lasts seconds under load, and a blocked
      // thread would be one of the cooperative pool's few.
      #expect(
        await eventually(timeout: .seconds(30)) { pressed.isSignaled },
        "no .warning while the child thrashes: \(levels.values)")
      #expect(!relieved.isSignaled, "no .normal while the child thrashes")
      #expect(await eventually { earlyCancelled.isSignaled }, "the second source saw the rise and cancelled itself")
      if counted != nil {
        // The file is this test's own: the one source left holds its four descriptors, no more.
        let watched = scope.path(of: .memory)
        #expect(await eventually { pressureDescriptorCount(of: watched) == 4 }, "\(pressureDescriptors(of: watched))")
      }
      // Stop the pressure: kill the child and anything else in its memory cgroup.
      for pid in limited.processes { kill(pid, SIGKILL) }
      kill(child, SIGKILL)
      #expect(await eventually { limited.processes.isEmpty })
      busy.map { _ = kill($0, SIGKILL) }
      #expect(
        await eventually(timeout: .seconds(20)) { relieved.isSignaled },
        ".normal after a quiet window: \(levels.values)")
      let seen = levels.values
      if counted != nil && access("/usr/bin/taskset", X_OK) == 0 {
        #expect(seen.first == .warning, "\(seen)")
        #expect(!seen.contains(.critical), "a task that never stalls keeps the full stall low: \(seen)")
      } else {
        #expect(seen.first == .warning || seen.first == .critical, "\(seen)")
      }
      #expect(seen.last == .normal)
      #expect(zip(seen, seen.dropFirst()).allSatisfy { $0 != $1 }, "each event is a change of level: \(seen)")
      #expect(seen.allSatisfy { [.normal, .warning, .critical].contains($0) }, "one level per event: \(seen)")
    }

    @Test("the default scope is the process's cgroup v2 or the system", .enabled(if: pressureAvailable, needsPSI))
    func defaultScope() throws {
      let source = try MemoryPressureSource(queue: Queue(label: "memory pressure"))
      #expect(source.watchedEvents == [.warning, .critical])
      // Worked out here independently: the 0:: line of /proc/self/cgroup.
      let membership = String(decoding: contentsOfFile("/proc/self/cgroup"), as: UTF8.self)
      let path = membership.split(separator: "\n").first { $0.hasPrefix("0::") }.map { String($0.dropFirst(3)) }
      // The true root cgroup (no cgroup.events) is the system; a container's "/" is its own cgroup.
      let directory = unifiedCgroupMount.map { $0 + (path == "/" ? "" : path ?? "") }
      if path != nil, let directory, access(directory + "/cgroup.events", F_OK) == 0,
        access(directory + "/memory.pressure", F_OK) == 0
      {
        #expect(source.scope == .cgroup(directory))
      } else {
        #expect(source.scope == .system)
      }
      #expect(PressureScope.current == source.scope)
    }

    @Test("unknown level bits stop the process with a message naming MemoryPressureSource, as for every option set")
    func unknownLevelBitsStop() async {
      let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
        _ = try? MemoryPressureSource(events: MemoryPressureEvents(rawValue: 0x18), queue: .global())
      }
      let text = standardError(of: result)
      #expect(text.contains("GCD: MemoryPressureSource(events: "), "\(text)")
      #expect(text.contains("no such memory-pressure level (bits 0x18)"), "\(text)")
    }

    @Test("bad inputs throw", .enabled(if: pressureAvailable, needsPSI))
    func badInputsThrow() {
      let queue = Queue(label: "memory pressure")
      let empty = #expect(throws: GCDError.self) { try MemoryPressureSource(events: [], queue: queue) }
      #expect(empty?.errno == EINVAL)
      #expect(empty?.operation.hasPrefix("MemoryPressureSource(events: [],") == true)
      let missing = #expect(throws: GCDError.self) {
        try MemoryPressureSource(scope: .cgroup("/nonexistent/gcd-cgroup"), queue: queue)
      }
      #expect(missing?.errno == ENOENT)
      #expect(missing?.detail?.contains("no pressure file at /nonexistent/gcd-cgroup/memory.pressure") == true)
    }

    @Test("dropping in every state closes all four descriptors", .enabled(if: pressureAvailable, needsPSI))
    func droppingInEveryStateIsSafe() throws {
      func count() -> Int { pressureDescriptorCount(of: "/proc/pressure/memory") }
      // Only this suite (serialized) opens the system's memory file: wait until the
      // sources of the tests before this one have closed theirs (a cancel handler is asynchronous).
      #expect(pollUntil { count() == 0 }, "\(pressureDescriptors(of: "/proc/pressure/memory"))")
      let baseline = count()
      let queue = Queue(label: "memory pressure")
      do {
        let held = try MemoryPressureSource(events: .all, scope: .system, queue: queue)
        #expect(count() == baseline + 4, "two triggers and their epolls")
        _ = held
      }
      #expect(pollUntil { count() == baseline }, "never started: \(pressureDescriptors(of: "/proc/pressure/memory"))")
      do {
        let started = try MemoryPressureSource(scope: .system, queue: queue)
        started.resume()
      }
      #expect(pollUntil { count() == baseline }, "started: \(pressureDescriptors(of: "/proc/pressure/memory"))")
      do {
        let suspended = try MemoryPressureSource(scope: .system, queue: queue)
        suspended.resume()
        suspended.suspend()
      }
      #expect(pollUntil { count() == baseline }, "suspended: \(pressureDescriptors(of: "/proc/pressure/memory"))")
      do {
        let suspendedBeforeStart = try MemoryPressureSource(scope: .system, queue: queue)
        suspendedBeforeStart.suspend()
      }
      #expect(
        pollUntil { count() == baseline }, "suspended before start: \(pressureDescriptors(of: "/proc/pressure/memory"))"
      )
      let cancels = Counter()
      do {
        let cancelled = try MemoryPressureSource(scope: .system, queue: queue)
        let done = Event()
        cancelled.setCancelHandler {
          cancels.increment()
          done.signal()
        }
        cancelled.resume()
        cancelled.cancel()
        #expect(done.wait())
      }
      #expect(pollUntil { count() == baseline }, "cancelled: \(pressureDescriptors(of: "/proc/pressure/memory"))")
      #expect(cancels.current == 1)
    }

    @Test("levels are Darwin's DISPATCH_MEMORYPRESSURE_* values")
    func levelValues() {
      #expect(MemoryPressureEvents.normal.rawValue == 0x1)
      #expect(MemoryPressureEvents.warning.rawValue == 0x2)
      #expect(MemoryPressureEvents.critical.rawValue == 0x4)
      #expect(MemoryPressureEvents.all == [.normal, .warning, .critical])
      #expect(MemoryPressureEvents([.warning, .critical]).description == "[.warning, .critical]")
      #expect(MemoryPressureSource.window == .seconds(2))
      #expect(MemoryPressureSource.warningThreshold < MemoryPressureSource.criticalThreshold)
    }
  }
}
