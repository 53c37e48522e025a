import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Runs every example executable (`Examples/<Name>`, shared/LISTINGS.md) and checks in what it prints,
/// and in the files it leaves, the invariants its listing demonstrates: orders, counts, values, never
/// timings. The examples print what they observe; the verdicts are made here.
@Suite(.serialized)
struct ExamplesTests {
  /// Package.swift lists the example targets by name (SwiftPM caches a manifest by its text, so a
  /// folder it found by listing `Examples/` would stay missing after it is added): this keeps the list
  /// and the folders equal, both ways.
  @Test("every folder Examples/<Name> with a main.swift is built as the executable Example<Name>, and no other")
  func everyFolderIsATarget() throws {
    let root = "\(#filePath)".split(separator: "/").dropLast(3).joined(separator: "/")
    let examples = "/" + root + "/Examples"
    let directory = try #require(opendir(examples), "cannot list \(examples)")
    defer { closedir(directory) }
    var folders: [String] = []
    while let entry = readdir(directory) {
      let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
      if access("\(examples)/\(name)/main.swift", F_OK) == 0 { folders.append(name) }
    }
    #expect(folders.count >= 20)
    for name in folders.sorted() {
      #expect(
        examplePath("Example\(name)") != nil, "Examples/\(name) is not built: add \"Example\(name)\" to Package.swift")
    }
    let manifest = String(decoding: contentsOfFile("/" + root + "/Package.swift"), as: UTF8.self)
    let listed = manifest.split(separator: "\n").compactMap { line -> String? in
      let text = line.drop { $0 == " " }
      guard text.hasPrefix("\"Example"), text.hasSuffix("\",") else { return nil }
      return String(text.dropFirst("\"Example".count).dropLast(2))
    }
    #expect(listed.sorted() == folders.sorted(), "Package.swift's examples and the folders differ")
  }

  @Test func queueFinalizer() async throws {
    let run = try await ExampleRun("QueueFinalizer")
    // Each task reads the context set through the queue; the finalizer runs once, after all of them
    // (it sees their count) and after the last reference went.
    run.expectOrder((1...3).map { "task \($0) reads context 'critical data'" })
    run.expectOrder(
      "dropping the program's reference to 'com.example.CriticalTaskQueue'",
      "myCleanUpDataContextFunction: 'critical data' after 3 tasks", "myFinalizerFunction: context freed")
    run.expect("myFinalizerFunction:", times: 1)
    run.expect("task ", times: 3)
  }

  @Test func asyncSync() async throws {
    let run = try await ExampleRun("AsyncSync")
    run.expect("The first block may or may not have run.")
    run.expectOrder("Do some work here.", "Do some more work here.", "Both blocks have completed.")
    run.expect("they ran in the order [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]")
  }

  @Test func completionBlock() async throws {
    let run = try await ExampleRun("CompletionBlock")
    // Delivered on the caller's queue, which is freed only after the block ran.
    run.expectOrder(
      "completion block: average 50, on 'com.example.CallerQueue'", "finalizer: 'com.example.CallerQueue' is freed")
    run.expect("completion block:", times: 1)
    run.expect("finalizer:", times: 1)
  }

  @Test func concurrentLoop() async throws {
    let run = try await ExampleRun("ConcurrentLoop", arguments: ["40"])
    run.expect("iterations: 40; indexes that ran exactly once: 40")
    run.expect("results that differ from the serial loop: 0")
    run.expect(" speed-up ")
  }

  @Test(arguments: [(limit: 4, tasks: 24, arguments: [String]()), (3, 16, ["3", "16"])])
  func semaphore(limit: Int, tasks: Int, arguments: [String]) async throws {
    let run = try await ExampleRun("Semaphore", arguments: arguments)
    run.expect("\(tasks) of \(tasks) tasks opened ")
    let peak = try #require(run.number(after: "peak: "), "no peak in:\n\(run.output)")
    #expect((1...limit).contains(peak), "\(peak) files open at once, with a limit of \(limit)")
    run.expect("files open at once (limit \(limit))")
  }

  @Test func groupWait() async throws {
    let run = try await ExampleRun("GroupWait", arguments: ["6"])
    run.expect("dispatch_group_wait returned: 6 of 6 tasks finished")
    run.expect("notify: 6 of 6 tasks finished")
    run.expect("wait(timeout: 50 ms) with one enter() outstanding: timed out")
    run.expect("wait(timeout: 10 s) after the matching leave(): done")
  }

  @Test func after() async throws {
    let run = try await ExampleRun("After", arguments: ["100"])
    let ran = run.output.matches(of: /(.+) ran after (\d+) ms \(due after (\d+) ms\)/).map {
      (name: String($0.1), elapsed: Int($0.2)!, due: Int($0.3)!)
    }
    let expected = [
      "dispatch_async": 0, "dispatch_after(dispatch_time(DISPATCH_TIME_NOW, delay))": 100,
      "dispatch_after(dispatch_walltime(&when, 0))": 200, "dispatch_after_f": 300,
    ]
    #expect(Dictionary(ran.map { ($0.name, $0.due) }, uniquingKeysWith: { $1 }) == expected, "\(run.output)")
    #expect(ran.count == 4, "\(run.output)")
    for item in ran {
      #expect(item.elapsed >= item.due, "\(item.name) ran before it was due:\n\(run.output)")
    }
  }

  @Test func suspendResume() async throws {
    let run = try await ExampleRun("SuspendResume", arguments: ["100"])
    run.expectOrder(
      "queue suspended twice (count 2): 0 of 5 blocks ran", "resumed once (count 1): 0 of 5 blocks ran",
      "resumed twice (count 0): the blocks ran in the order [1, 2, 3, 4, 5]",
      "source suspended (isSuspended true), merged 1...5: deliveries []",
      "source resumed (isSuspended false): deliveries [15]")
  }

  @Test func targetQueue() async throws {
    let run = try await ExampleRun("TargetQueue", arguments: ["2"])
    run.expectOrder(
      "block 1, queued before setTarget, runs through the old target",
      "block 2, queued before setTarget, runs through the old target",
      "block 3, queued after setTarget, runs through the new target",
      "block 4, queued after setTarget, runs through the new target",
      "event 1 runs through the old target", "event 2 runs through the old target",
      "event 3 runs through the new target", "event 4 runs through the new target")
    run.expect(" runs through ", times: 8)
  }

  @Test func functionHandlers() async throws {
    let run = try await ExampleRun("FunctionHandlers")
    run.expect("dispatch_apply_f: squares [0, 1, 4, 9, 16, 25, 36, 49]")
    run.expectOrder((1...3).map { "myCountingFunction: call \($0) for 'the queue's context'" })
    run.expectOrder(
      "myCountingFunction: call 1 for 'the source's context'", "myCountingFunction: call 2 for 'the source's context'",
      "myFreeFunction: freeing 'the source's context' after 2 calls",
      "myFreeFunction: freeing 'the queue's context' after 3 calls")
    run.expect("myCountingFunction:", times: 5)
    run.expect("myFreeFunction:", times: 2)
  }

  @Test func mainQueue() async throws {
    let run = try await ExampleRun("MainQueue")
    run.expectOrder(
      "blocks run before the main queue is drained: 0 of 12", "the main thread calls Queue.dispatchMain()",
      "block 1 runs on ")
    for producer in 1...3 {
      run.expectOrder((1...4).map { "com.example.Producer\(producer) block \($0) runs on the main thread" })
    }
    run.expect(" runs on the main thread", times: 12)
    run.expect(" runs on another thread", times: 0)
    run.expect("all 12 blocks ran; exit(0) from a main-queue block")
  }

  // MARK: - Sources

  @Test func timer() async throws {
    let run = try await ExampleRun("Timer", arguments: ["0.05", "4"])
    let ticks = run.lines(after: "MyPeriodicTask: tick ")
    #expect(ticks.map { $0.prefix { $0 != " " } } == ["1", "2", "3", "4"], "\(run.output)")
    #expect(ticks.allSatisfy { $0.hasPrefix("\($0.first!) of 4 at ") && $0.hasSuffix(", on the main queue") })
  }

  @Test func readFile() async throws {
    let directory = TemporaryDirectory()
    let text = (1...3000).map { "line \($0) of the file the read source reads\n" }.joined()
    let file = directory.file("input.txt", contents: text)
    let size = text.utf8.count
    let run = try await ExampleRun("ReadFile", arguments: [file])

    let calls = run.lines(after: "event handler: ").map { $0.split(separator: " ") }
    let available = calls.map { Int($0[0]) }
    let reads = calls.map { Int($0.last!) }
    // The source reports the whole file readable at first, nothing at the end; the reads add up to it.
    #expect(available.first == size && available.last == 0, "\(run.output)")
    #expect(reads.last == 0 && reads.reduce(0) { $0 + ($1 ?? -size) } == size, "\(run.output)")
    run.expectOrder(
      "MyProcessFileData: end of file after \(size) bytes, 3000 lines", "cancel handler: close(fd) returned 0")
    run.expect("cancel handler:", times: 1)
  }

  @Test func writeFile() async throws {
    let directory = TemporaryDirectory()
    let file = directory.path + "/output.txt"
    let text = (1...1000).map { "line \($0) that the write source's handler writes\n" }.joined()
    let size = text.utf8.count
    let run = try await ExampleRun("WriteFile", arguments: [file, text])
    run.expect("event handler: write(fd, buffer, \(size)) returned \(size)")
    run.expect("event handler:", times: 1)
    run.expectOrder("event handler:", "cancel handler: close(fd) returned 0")
    let written = contentsOfFile(file)
    #expect(written == Array(text.utf8), "the file holds \(written.count) bytes, not the \(size) written")
  }

  @Test func signal() async throws {
    let run = try await ExampleRun("Signal", arguments: ["5", "3"])
    let events = run.output.matches(of: /this event stands for (\d+) SIGHUP\(s\), (\d+) so far/).map {
      (count: Int($0.1)!, total: Int($0.2)!)
    }
    // Each event stands for at least one delivery, the totals add up, and no more are counted than
    // were sent; the burst may merge, but each of the three sent one at a time is an event.
    #expect(events.count >= 4 && events.allSatisfy { $0.count >= 1 }, "\(run.output)")
    #expect(events.indices.allSatisfy { events[$0].total == events[...$0].reduce(0) { $0 + $1.count } })
    let counted = try #require(run.number(after: "sent 8 SIGHUPs; counted "), "\(run.output)")
    #expect(counted == events.last?.total && (4...8).contains(counted), "\(run.output)")
    run.expectOrder("5 times in a row", "MyProcessSIGHUP", "3 times, each after the handler has run", "still runs")
  }

  @Test func removeSource() async throws {
    let run = try await ExampleRun("RemoveSource")
    run.expectOrder(
      "event handler: read 1 byte; working", "RemoveDispatchSource returned while the event handler runs",
      "event handler: finished its work", "cancel handler: close(fd) returned 0")
    run.expect("event handler: read", times: 1)
    run.expect("cancel handler:", times: 1)
  }

  @Test func dataAdd() async throws {
    let run = try await ExampleRun("DataAdd")
    func values(_ name: String) -> [UInt] { run.lines(after: "\(name) handler: ").map { UInt($0)! } }
    func runningTotals(_ values: [UInt], _ combine: (UInt, UInt) -> UInt) -> [UInt] {
      values.reduce(into: []) { $0.append(combine($0.last ?? 0, $1)) }
    }
    // Each value a handler sees merges some of the next merges in order: the running sums are sums of
    // 1…4 up to some i, the running ORs ORs of them; the last is 10 (7 for DATA_OR).
    let sums = runningTotals(values("DATA_ADD"), +)
    #expect(sums.last == 10 && Set(sums).isSubset(of: [1, 3, 6, 10]), "\(run.output)")
    let ors = runningTotals(values("DATA_OR"), |)
    #expect(ors.last == 7 && Set(ors).isSubset(of: [1, 3, 7]), "\(run.output)")
    #expect(values("DATA_ADD, spaced") == [1, 2, 3, 4], "\(run.output)")
    run.expectOrder(
      "DATA_ADD: the values the handler saw combine to 10", "DATA_OR: the values the handler saw combine to 7",
      "DATA_ADD, spaced: the values the handler saw combine to 10")
    run.expect("~~~~~~~~~~~~~~", times: 12)
  }

  @Test func progress() async throws {
    let run = try await ExampleRun("Progress")
    let steps = run.output.matches(of: /progress: ([0-9.]+) \(\+(\d+)\)/).map { (Double($0.1)!, Int($0.2)!) }
    let totals = steps.reduce(into: [Int]()) { $0.append(($0.last ?? 0) + $1.1) }
    // Progress is the running total of the merged values over 100, and ends at exactly 1.0.
    #expect(steps.map(\.0) == totals.map { Double($0) / 100 }, "\(run.output)")
    #expect(steps.last?.0 == 1.0 && totals.last == 100, "\(run.output)")
    #expect(steps.count < 100, "\(steps.count) handler calls for 100 merges")
    run.expect("\(steps.count) handler calls for 100 merges")
  }

  @Test func monitorParent() async throws {
    let run = try await ExampleRun("MonitorParent")
    let parent = try #require(run.number(after: "started parent "), "\(run.output)")
    let child = try #require(run.number(after: "\nchild "), "\(run.output)")
    run.expectOrder(
      "child \(child): watching parent \(parent) with ProcSource",
      "parent \(parent): child \(child) watches me; exiting",
      "child \(child): parent \(parent) sent [.exit]; MySetAppExitFlag()", "child \(child): the exit flag is set",
      "parent and child are done")
  }

  @Test func monitorRename() async throws {
    let directory = TemporaryDirectory()
    let file = directory.file("watched.txt")
    let run = try await ExampleRun("MonitorRename", arguments: [file])
    run.expectOrder(
      "MyUpdateFileName: [.rename] on descriptor ", ": \(file) -> \(file).1\n", "MyUpdateFileName: [.rename] on ",
      ": \(file).1 -> \(file).2\n", "cancel handler: free('\(file).2'), close(fd) returned 0")
    run.expect("MyUpdateFileName:", times: 2)
    #expect(access(file + ".2", F_OK) == 0 && access(file, F_OK) != 0 && access(file + ".1", F_OK) != 0)
  }

  // Needs PSI, root and the cgroup v1 memory controller to make pressure; where it cannot, the next
  // test checks that it says why instead. Its children's stall is direct reclaim of their mapped
  // pages, which needs no disk and grows when the CPUs are busy (a task waiting for a CPU inside
  // reclaim still counts as stalled), so it runs beside the other suites, the pressure ones too.
  @Test(.enabled(if: canMakeMemoryPressure, needsMemoryPressure)) func memoryPressure() async throws {
    let run = try await ExampleRun("MemoryPressure")
    run.expectOrder(
      "cache: 64 entries\n", "watching memory pressure in ",
      "child 1: reads a 96 MiB mapping in a 48 MiB memory cgroup\n", "level [.", "children: stopped\n",
      "level [.normal]: the cache may grow again, 64 entries\n", "pressure came and went\n")
    // The first level the handler saw is a rise, and it shed the cache.
    let first = try #require(run.lines(after: "level ").first, "\(run.output)")
    #expect(
      first.hasPrefix("[.warning]: shed half the cache, 32 entries left")
        || first.hasPrefix("[.critical]: shed the whole cache, 0 entries left"), "\(run.output)")
    run.expect("level [.normal]", times: 1)
  }

  @Test(.enabled(if: !canMakeMemoryPressure, examplePressuresHere)) func memoryPressureExplainsItself() async throws {
    let run = try await ExampleRun("MemoryPressure")
    run.expectOrder("cache: 64 entries\n", "cannot make memory pressure here: ")
    run.expect("level [", times: 0)
  }
}
