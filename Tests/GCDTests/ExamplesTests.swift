import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Runs the queue-side example executables (`Examples/<Name>`) and checks what their output says they
/// demonstrated: the invariants, never the timings.
///
/// The examples are executable targets of this package, so `swift build` puts them next to the test
/// bundle; each test starts one with `posix_spawn`, kills it if it runs longer than a generous timeout,
/// and expects exit status 0.
@Suite(.serialized)
struct ExamplesTests {
  @Test func queueFinalizer() async throws {
    let run = try await ExampleRun("QueueFinalizer")
    for task in 1...3 {
      run.expect("task \(task) reads context 'critical data'")
    }
    run.expect("myFinalizerFunction: 'critical data' after 3 tasks")
    run.expect("finalizer runs: 1 ")
    run.expect("live contexts after the finalizer: 0")
  }

  @Test func asyncSync() async throws {
    let run = try await ExampleRun("AsyncSync")
    run.expectOrder("Do some work here.", "Do some more work here.", "Both blocks have completed.")
    run.expect("sync returned after both blocks ran: true")
    run.expect("ten async items ran in FIFO order: true")
  }

  @Test func completionBlock() async throws {
    let run = try await ExampleRun("CompletionBlock")
    run.expect("average computed on the default global queue: true")
    run.expect("completion block got average 50 on 'com.example.CallerQueue'")
    run.expect("result delivered on the caller's queue: true")
    run.expect("caller's queue kept alive until the block ran: true")
  }

  @Test func concurrentLoop() async throws {
    let run = try await ExampleRun("ConcurrentLoop", arguments: ["40"])
    run.expect("iterations: 40 ")
    run.expect("every index ran exactly once: true")
    run.expect("result equals the serial loop: true")
    run.expect("speed-up: ")
    run.expect("apply on a serial queue runs in index order: true")
  }

  @Test(arguments: [[String](), ["3", "16"]])
  func semaphore(arguments: [String]) async throws {
    let run = try await ExampleRun("Semaphore", arguments: arguments)
    let limit = arguments.first.flatMap { Int($0) } ?? 4
    let peak = try #require(run.number(after: "peak open files: "))
    run.expect("(limit \(limit))")
    #expect(peak >= 1 && peak <= limit, "peak \(peak) must be within 1...\(limit)")
    run.expect("never more than the limit: true")
    run.expect("open failures: 0")
    run.expect("descriptors leaked: 0")
  }

  @Test func groupWait() async throws {
    let run = try await ExampleRun("GroupWait")
    run.expect("wait returned only after every task: true")
    run.expect("notify ran after every task: true")
    run.expect("with work outstanding timed out: true")
    run.expect("after leave(), wait(timeout:) reports completion: true")
  }

  @Test func after() async throws {
    let run = try await ExampleRun("After", arguments: ["100"])
    run.expect("all four ran: true")
    run.expect("none ran before its time: true")
    for name in [
      "async (no delay)", "relative (after 100 ms)", "wall clock (at now + 200 ms)", "dispatch_after_f (after 300 ms)",
    ] {
      run.expect("\(name) ran after")
    }
  }

  @Test func suspendResume() async throws {
    let run = try await ExampleRun("SuspendResume")
    run.expect("while suspended, items run: 0 of 5")
    run.expect("after one resume (count 1), items run: 0 of 5")
    run.expect("after the second resume (count 0), items run: 5 of 5")
    run.expect("they ran in the order submitted: true")
    run.expect("suspend and resume balanced: true")
    run.expect("the running item finished and the next one waited: true")
    run.expect("a queue dropped while suspended still ran its queued item: true")
    run.expect("source suspended twice, merged 1...5: deliveries while suspended: 0")
    run.expect("source after one resume (one suspend() outstanding), deliveries: 0")
    run.expect("source after the second resume, deliveries: [15]")
    run.expect("the five merges arrived as one coalesced delivery of 15: true")
    run.expect("source suspend and resume balanced, the next merge is delivered alone: true")
  }

  @Test func targetQueue() async throws {
    let run = try await ExampleRun("TargetQueue")
    run.expect("items run while TargetA is suspended: 0 of 6")
    run.expect("items queued before setTarget ran through the old target: true")
    run.expect("items queued after setTarget ran through the new target: true")
    run.expect("two concurrent queues through one serial target, most at once: 1")
    run.expect("setTarget(newQueue); the source's queue is now the new one: true")
    run.expect("source events before setTarget ran on the old queue: true")
    run.expect("source events after setTarget ran on the new queue: true")
  }

  @Test func functionHandlers() async throws {
    let run = try await ExampleRun("FunctionHandlers")
    run.expectOrder("myAsyncFunction ran", "mySyncFunction sees 1 async run(s) before it")
    run.expect("apply_f filled every slot: true")
    run.expect("notify_f ran after every group_async_f task: true")
    run.expect("dispatch_after_f: myLaterFunction ran")
    run.expect("finalizer ran once: true")
  }

  @Test func mainQueue() async throws {
    let run = try await ExampleRun("MainQueue")
    run.expect("items run before the main queue is drained: 0 of 12")
    run.expect("Queue.main.sync from a global queue ran on the main queue: true")
    run.expect("main-queue items run: 12 of 12")
    run.expect("every item saw Queue.main.isCurrent: true")
    run.expect("most main-queue items running at once: 1")
    run.expect("each producer's items ran in the order submitted: true")
    run.expect("items on the main thread (tid == pid): 12 of 12; threads that drained the main queue: 1")
    run.expect("exit(0) from a main-queue work item")
  }

  // MARK: - Sources

  @Test func timer() async throws {
    let run = try await ExampleRun("Timer", arguments: ["0.05", "4"])
    run.expect("interval 50 ms, 4 ticks, handler on the main queue")
    run.expectOrder("tick 1 at ", "tick 2 at ", "tick 3 at ", "tick 4 at ")
    #expect(!run.output.contains("on the main queue: false"), "a tick ran off the main queue:\n\(run.output)")
    #expect(!run.output.contains("tick 5 "), "the timer ticked after the last tick:\n\(run.output)")
    run.expect("ticks: 4 of 4")
  }

  @Test func readFile() async throws {
    let run = try await ExampleRun("ReadFile")
    run.expect("bytes available at the first call: 204800, at the last call (end of file): 0")
    run.expect("bytes read: 204800 of 204800")
    run.expect("whole file read, byte for byte: true")
    run.expect("cancelled: true")
    run.expect("closed by the cancel handler: true")
  }

  @Test func writeFile() async throws {
    let run = try await ExampleRun("WriteFile")
    run.expect("handler calls: 1 ")
    run.expect("bytes written: 65582 of 65582")
    run.expect("content matches: true")
    run.expect("closed by the cancel handler: true")
  }

  @Test func signal() async throws {
    let run = try await ExampleRun("Signal", arguments: ["5", "3"])
    run.expect("spaced: 3 sent")
    // Deliveries merge (the kernel keeps one SIGHUP pending), so the count is at most what was sent;
    // each spaced signal is sent after the handler ran, so at least those (less one still in flight).
    let counted = try #require(run.number(after: "total deliveries counted by `count`: "))
    #expect(counted >= 3 && counted <= 8, "counted \(counted) of 8 sent")
    run.expect("no SIGHUP ended it")
  }

  @Test func removeSource() async throws {
    let run = try await ExampleRun("RemoveSource")
    run.expectOrder(
      "event handler 1: started", "RemoveDispatchSource returned", "event handler 1: finished its work",
      "cancel handler (call 1): close(fd)")
    run.expect("order of events: the running handler finished, then the cancel handler ran: true")
    run.expect("event handler calls: 1 ")
    run.expect("cancel handler calls: 1")
    run.expect("closed by the cancel handler: true")
  }

  @Test func dataAdd() async throws {
    let run = try await ExampleRun("DataAdd", arguments: ["50"])
    run.expectOrder(
      "fast DATA_ADD: handler calls", "sum of what was seen: 10 (expected 10)",
      "fast DATA_OR: handler calls", "OR of what was seen: 7 (expected 7)",
      "spaced DATA_ADD: handler calls", "sum of what was seen: 10 (expected 10)")
  }

  @Test func progress() async throws {
    let run = try await ExampleRun("Progress")
    run.expect("progress reached exactly 1.0: true")
    let calls = try #require(run.number(after: "handler calls: "))
    #expect(calls >= 1 && calls < 100, "\(calls) handler calls for 100 merges")
    run.expect("for 100 merges (coalesced: true)")
  }

  @Test func monitorParent() async throws {
    let run = try await ExampleRun("MonitorParent")
    run.expect("watcher saw its parent exit: true")
    run.expect("self-owned source released after cancel: true")
  }

  @Test func monitorRename() async throws {
    let run = try await ExampleRun("MonitorRename")
    run.expectOrder(
      "event 1: [.rename]", "source.path now ends with first-rename.txt: true",
      "event 2: [.rename]", "source.path now ends with second-rename.txt: true")
    run.expect("rename events: 2")
  }
}

/// One finished run of an example: its combined standard output and error, checked to have exited 0.
private struct ExampleRun {
  /// How long an example may run before it is killed: theirs take a second or two, but the machine
  /// may be loaded.
  static let timeout: Duration = .seconds(60)

  let name: String
  let output: String

  /// Runs `Example<name>` with `arguments` and records a test issue unless it exits 0 in time.
  init(_ name: String, arguments: [String] = [], sourceLocation: SourceLocation = #_sourceLocation) async throws {
    self.name = name
    let executable = try #require(
      examplePath("Example\(name)"),
      """
      Example\(name) was not found next to the test bundle (\(testExecutablePath())) or in any folder \
      above it. Run `swift build` first, so that the example executables are built.
      """, sourceLocation: sourceLocation)
    let result = try await spawnAndWait(executable, arguments: arguments, timeout: ExampleRun.timeout)
    output = result.output
    #expect(
      !result.timedOut, "Example\(name) did not exit within \(ExampleRun.timeout) and was killed:\n\(output)",
      sourceLocation: sourceLocation)
    #expect(
      result.status == 0, "Example\(name) \(result.statusText), output:\n\(output)", sourceLocation: sourceLocation)
  }

  /// Expects the output to contain `text`.
  func expect(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
    let found = output.contains(text)
    #expect(found, "Example\(name) did not print \"\(text)\"; its output:\n\(output)", sourceLocation: sourceLocation)
  }

  /// Expects the output to contain each of `texts`, in this order.
  func expectOrder(_ texts: String..., sourceLocation: SourceLocation = #_sourceLocation) {
    var rest = output[...]
    var missing: String?
    for text in texts {
      guard let range = rest.firstRange(of: text) else {
        missing = text
        break
      }
      rest = rest[range.upperBound...]
    }
    let inOrder = missing == nil
    #expect(
      inOrder, "Example\(name) did not print \(texts) in this order; its output:\n\(output)",
      sourceLocation: sourceLocation)
  }

  /// The integer printed right after `prefix`.
  func number(after prefix: String) -> Int? {
    guard let range = output.firstRange(of: prefix) else { return nil }
    return Int(output[range.upperBound...].prefix(while: { $0.isNumber }))
  }
}

/// The path of the running test executable.
private func testExecutablePath() -> String {
  var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
  let length = buffer.withUnsafeMutableBytes { readlink("/proc/self/exe", $0.baseAddress!, $0.count - 1) }
  if length > 0 { return String(decoding: buffer[..<length], as: UTF8.self) }
  return CommandLine.arguments.first ?? ""
}

/// The path of the example executable `name` in the build products folder: the test executable's folder
/// or one above it (a test bundle may sit inside the products folder).
private func examplePath(_ name: String) -> String? {
  var directory = testExecutablePath()
  while let slash = directory.lastIndex(of: "/"), slash != directory.startIndex {
    directory = String(directory[..<slash])
    if access("\(directory)/\(name)", X_OK) == 0 { return "\(directory)/\(name)" }
  }
  return nil
}

private struct SpawnResult {
  var output: String
  var status: Int32
  var timedOut: Bool

  var statusText: String {
    status >= 0 ? "exited with status \(status)" : "was killed by signal \(-status)"
  }
}

/// Runs `path` with its standard output and error going to one temporary file, waits for it for at
/// most `timeout` (then kills it), and returns what it wrote and how it ended (a negative status is a
/// signal number).
private func spawnAndWait(_ path: String, arguments: [String], timeout: Duration) async throws -> SpawnResult {
  var template = Array("/tmp/gcd-example-output-XXXXXX".utf8CString)
  let outputFD = mkstemp(&template)
  try #require(outputFD >= 0, "mkstemp failed: errno \(errno)")
  let outputPath = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
  defer {
    close(outputFD)
    unlink(outputPath)
  }

  var actions = posix_spawn_file_actions_t()
  posix_spawn_file_actions_init(&actions)
  defer { posix_spawn_file_actions_destroy(&actions) }
  posix_spawn_file_actions_adddup2(&actions, outputFD, STDOUT_FILENO)
  posix_spawn_file_actions_adddup2(&actions, outputFD, STDERR_FILENO)
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0)

  let argv = ([path] + arguments).map { strdup($0) } + [nil]
  defer { argv.forEach { free($0) } }
  var pid: pid_t = 0
  let spawned = posix_spawn(&pid, path, &actions, nil, argv, environ)
  try #require(spawned == 0, "posix_spawn(\(path)) failed: errno \(spawned)")

  let deadline = ContinuousClock.now + timeout
  var rawStatus: Int32 = 0
  var timedOut = false
  while true {
    let waited = waitpid(pid, &rawStatus, WNOHANG)
    if waited == pid { break }
    if waited < 0 && errno != EINTR {
      Issue.record("waitpid failed: errno \(errno)")
      break
    }
    if ContinuousClock.now >= deadline {
      timedOut = true
      kill(pid, SIGKILL)
      _ = waitpid(pid, &rawStatus, 0)
      break
    }
    try await Task.sleep(for: .milliseconds(10))
  }

  // WIFEXITED / WEXITSTATUS / WTERMSIG are macros: decode the status word by hand.
  let signal = rawStatus & 0x7f
  let status = signal == 0 ? (rawStatus >> 8) & 0xff : -signal

  var bytes: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 4096)
  lseek(outputFD, 0, SEEK_SET)
  while true {
    let count = read(outputFD, &chunk, chunk.count)
    if count <= 0 { break }
    bytes += chunk[..<count]
  }
  return SpawnResult(output: String(decoding: bytes, as: UTF8.self), status: status, timedOut: timedOut)
}
