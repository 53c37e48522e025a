import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Examples/SignalService run with `--external`: the test is the
/// orchestrator that sends the signals; it checks what the service prints
/// (order and counts), not timings.
@Suite("SignalService example")
struct SignalServiceExampleTests {
  // Under LIBDISPATCH_STRICT=1, where libdispatch stops the process at any deprecated use: a
  // signal sequence on the default queue never changes its sources' target after activation.
  @Test(
    "SIGHUP reloads once, SIGTERM shuts down after it; the service exits 0, also under LIBDISPATCH_STRICT=1",
    .timeLimit(.minutes(2)))
  func orchestrated() async throws {
    let executable = try #require(examplePath("ExampleSignalService"), "run `swift build` first")
    var ends: [Int32] = [-1, -1]
    // Close-on-exec: no other test's child inherits the write end (and holds the output open).
    #expect(pipe(&ends) == 0)
    for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
    let pid = try spawnProcess(executable, ["--external"], stdout: ends[1], environment: ["LIBDISPATCH_STRICT=1"])
    close(ends[1])
    let output = ends[0]
    defer { close(output) }
    var lines = LineReader(descriptor: output)
    let started = lines.next()
    #expect(started?.hasPrefix("started, pid \(pid)") == true, "\(started ?? "end of output")")
    // The sequence was made at the start: a SIGHUP now is kept, even before the child task iterates.
    kill(pid, SIGHUP)
    #expect(lines.next() == "reload 1")
    kill(pid, SIGTERM)
    var rest: [String] = []
    while let line = lines.next() { rest.append(line) }
    #expect(rest == ["received SIGTERM: shutting down", "served some requests, shut down cleanly"])
    let status = reapProcess(pid)
    #expect(status == 0, "exit status \(status)")
  }

  @Test("alone: it signals itself, the SIGHUP sent before iterating is kept, then SIGTERM stops it")
  func alone() async throws {
    let run = try await ExampleRun("SignalService")
    run.expectOrder("started, pid ", "reload 1", "received SIGTERM: shutting down", "served some requests")
    run.expect("reload ", times: 1)
    run.expect("shut down cleanly", times: 1)
  }
}

/// Lines read from a pipe with blocking reads (the test has a time limit).
private struct LineReader {
  let descriptor: Int32
  var buffer: [UInt8] = []

  init(descriptor: Int32) { self.descriptor = descriptor }

  /// The next line without its newline, or nil at the end of the output.
  mutating func next() -> String? {
    while true {
      if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
        let line = String(decoding: buffer[..<newline], as: UTF8.self)
        buffer.removeSubrange(...newline)
        return line
      }
      var chunk = [UInt8](repeating: 0, count: 256)
      let count = read(descriptor, &chunk, chunk.count)
      if count < 0 && errno == EINTR { continue }
      if count <= 0 {
        defer { buffer = [] }
        return buffer.isEmpty ? nil : String(decoding: buffer, as: UTF8.self)
      }
      buffer += chunk[..<count]
    }
  }
}
