import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// One finished run of an example executable (`Examples/<Name>`): its combined standard output and
/// error, checked to have exited 0 in time.
///
/// The examples are executable targets of this package, so `swift build` puts them next to the test
/// bundle; a run starts one with `posix_spawn`, kills it if it runs longer than a generous timeout,
/// and records a test issue unless it exits with status 0.
struct ExampleRun {
  /// How long an example may run before it is killed: theirs take a second or two, but the machine
  /// may be loaded.
  static let timeout: Duration = .seconds(60)

  let name: String
  let output: String

  /// Runs `Example<name>` with `arguments`, and `environment` added to this process's.
  init(
    _ name: String, arguments: [String] = [], environment: [String: String] = [:],
    sourceLocation: SourceLocation = #_sourceLocation
  ) async throws {
    self.name = name
    let executable = try #require(
      examplePath("Example\(name)"),
      """
      Example\(name) was not found next to the test bundle (\(testExecutablePath())) or in any folder \
      above it. Run `swift build` first, so that the example executables are built.
      """, sourceLocation: sourceLocation)
    let result = try await spawnAndWait(
      executable, arguments: arguments, environment: environment, timeout: ExampleRun.timeout)
    output = result.output
    #expect(
      !result.timedOut, "Example\(name) did not exit within \(ExampleRun.timeout) and was killed:\n\(output)",
      sourceLocation: sourceLocation)
    #expect(
      result.status == 0, "Example\(name) \(result.statusText), output:\n\(output)", sourceLocation: sourceLocation)
  }

  /// The output's lines.
  var lines: [Substring] { output.split(separator: "\n") }

  /// The lines that start with `prefix`, without it.
  func lines(after prefix: String) -> [Substring] {
    lines.filter { $0.hasPrefix(prefix) }.map { $0.dropFirst(prefix.count) }
  }

  /// How many times `text` occurs in the output.
  func count(_ text: String) -> Int { output.ranges(of: text).count }

  /// The integer printed right after the first `prefix`.
  func number(after prefix: String) -> Int? {
    guard let range = output.firstRange(of: prefix) else { return nil }
    return Int(output[range.upperBound...].prefix(while: { $0.isNumber }))
  }

  /// Expects the output to contain `text`.
  func expect(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
    let found = output.contains(text)
    #expect(found, "Example\(name) did not print \"\(text)\"; its output:\n\(output)", sourceLocation: sourceLocation)
  }

  /// Expects the output to contain `text` exactly `times` times.
  func expect(_ text: String, times: Int, sourceLocation: SourceLocation = #_sourceLocation) {
    let found = count(text)
    #expect(
      found == times, "Example\(name) printed \"\(text)\" \(found) times, not \(times); its output:\n\(output)",
      sourceLocation: sourceLocation)
  }

  /// Expects the output to contain each of `texts`, in this order.
  func expectOrder(_ texts: String..., sourceLocation: SourceLocation = #_sourceLocation) {
    expectOrder(texts, sourceLocation: sourceLocation)
  }

  /// Expects the output to contain each of `texts`, in this order.
  func expectOrder(_ texts: [String], sourceLocation: SourceLocation = #_sourceLocation) {
    var rest = output[...]
    var missing: String?
    for text in texts {
      guard let range = rest.firstRange(of: text) else {
        missing = text
        break
      }
      rest = rest[range.upperBound...]
    }
    #expect(
      missing == nil,
      "Example\(name) did not print \(texts) in this order (\"\(missing ?? "")\" missing); its output:\n\(output)",
      sourceLocation: sourceLocation)
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
func examplePath(_ name: String) -> String? {
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
private func spawnAndWait(
  _ path: String, arguments: [String], environment: [String: String], timeout: Duration
) async throws -> SpawnResult {
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
  var inherited: [String] = []
  var entry = environ
  while let variable = entry.pointee {
    let text = String(cString: variable)
    if !environment.keys.contains(where: { text.hasPrefix("\($0)=") }) { inherited.append(text) }
    entry += 1
  }
  let envp = (inherited + environment.map { "\($0.key)=\($0.value)" }).map { strdup($0) } + [nil]
  defer { envp.forEach { free($0) } }
  var pid: pid_t = 0
  let spawned = posix_spawn(&pid, path, &actions, nil, argv, envp)
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
