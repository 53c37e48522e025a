import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The standard error of an exit test's child process, as text ("" when the
/// exit test itself failed to run).
func standardError(of result: ExitTest.Result?) -> String {
  guard let result else { return "" }
  return String(decoding: result.standardErrorContent, as: UTF8.self)
}

/// For exit-test bodies that expect the process to die while `event` is
/// pending: waits for it, then ends the child with status 0 so that the
/// parent's `.failure` expectation fails instead of the child hanging.
@available(*, noasync, message: "blocks the thread")
func exitIfSurvived(waitingFor event: Event) -> Never {
  event.wait()
  exit(0)
}

/// For exit-test bodies that expect the process to survive: ends the child
/// with a failure status (and a message on standard error) unless `event`
/// is signalled within the generous timeout.
@available(*, noasync, message: "blocks the thread")
func requireInChild(_ event: Event, _ message: String) {
  if !event.wait() { failChild(message) }
}

/// `requireInChild` for a latch: every count must arrive in time.
@available(*, noasync, message: "blocks the thread")
func requireInChild(_ latch: Latch, _ message: String) {
  if !latch.wait() { failChild(message) }
}

/// Ends an exit test's child process with status 3 and `message` on
/// standard error.
func failChild(_ message: String) -> Never {
  do {
    let text = Array("exit-test child: \(message)\n".utf8)
    _ = text.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
  }
  exit(3)
}

/// Ends an exit test's child with status 0 and "exit-test child: `message`"
/// on standard error. `#expect(processExitsWith:)` returns no result — so no
/// standard error — when the status is not the expected one; a child that
/// must explain what it found exits 0 through here, and the parent checks
/// for "exit-test child: ok" and shows the text otherwise.
func endChild(_ message: String) -> Never {
  let text = Array("exit-test child: \(message)\n".utf8)
  _ = text.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
  exit(0)
}

/// The parent's check of a child that used `childCheck`: it exited as expected (else no result)
/// and reported no failure. A child's `childCheck` ends it with status 0 and a "failed:" line, so
/// an exit test whose parent checks only the status would pass whatever the child found.
func expectChildPassed(_ result: ExitTest.Result?, sourceLocation: SourceLocation = #_sourceLocation) {
  let text = standardError(of: result)
  #expect(
    result != nil && !text.contains("exit-test child: failed"), "\(text)", sourceLocation: sourceLocation)
}

/// The parent's check of a child that ends with `endChild("ok")` once every check passed: that
/// line is on its standard error (else the text it wrote instead).
func expectChildSaidOK(_ result: ExitTest.Result?, sourceLocation: SourceLocation = #_sourceLocation) {
  let text = standardError(of: result)
  #expect(text.contains("exit-test child: ok"), "\(text)", sourceLocation: sourceLocation)
}

/// In a child that reports through `endChild`: ends it with "failed:
/// `message`" unless `condition` holds.
func childCheck(_ condition: Bool, _ message: @autoclosure () -> String) {
  if !condition { endChild("failed: \(message())") }
}

/// In a child that reports through `endChild`: what `body` returns, or, when it throws, the child
/// ends with "failed: `error`".
func childTry<T>(_ body: () throws -> T) -> T {
  do { return try body() } catch { endChild("failed: \(error)") }
}

/// Whether this test process was built with AddressSanitizer or
/// ThreadSanitizer (`make sanitize`): heavy loops run fewer rounds there,
/// where every allocation and every dispatch call is several times slower.
let runningUnderSanitizer =
  dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__asan_init") != nil
  || dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__tsan_init") != nil

/// Runs `body` synchronously. Exit-test bodies are asynchronous contexts, where the blocking calls
/// (`sync`, `apply`, marked `noasync`) warn; the tests that make them block, or trap, on purpose.
func blocking<T>(_ body: () throws -> T) rethrows -> T { try body() }

/// In an exit test's child that the parent does not observe: unless `condition` holds, records
/// `message` as an issue — the testing library carries it to the parent through its back channel,
/// where it fails the test with this message and location — writes it to standard error too, and
/// ends the child with status 1. The record does not depend on `Test.current`, which is nil in an
/// exit test's body (a check on it sent every message to standard error only, which the parent of
/// a failed exit test never shows: its result is nil).
///
/// The long children report this way, with `#expect(processExitsWith: .success)` and no
/// `observing:`. The testing library reads an observed child's standard error, and its back
/// channel, with blocking reads on the parent's cooperative threads — on 2 cores, both of them —
/// so a long observed child stops every other test of the parallel suite until it ends (the first
/// CI run of the merged tree: 94 s without progress, and the pressure tests' time limits ran out).
/// Unobserved, it holds one thread.
func requireInChild(
  _ condition: Bool, _ message: @autoclosure () -> String, sourceLocation: SourceLocation = #_sourceLocation
) {
  guard !condition else { return }
  let text = "exit-test child: \(message())"
  Issue.record(Comment(rawValue: text), sourceLocation: sourceLocation)
  let line = Array("\(text)\n".utf8)
  _ = line.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
  exit(1)
}
