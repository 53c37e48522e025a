// A `cat` of one file: copies it to standard output through two stream
// channels, one reading the file (opened by `IOChannel(path:)`, which throws
// at once for a missing file) and one writing standard output, chunk by
// chunk with back-pressure (the next chunk is read once the previous one is
// written). A summary goes to standard error.
//
// The output channel sets O_NONBLOCK on standard output while it runs; the
// program waits for that channel's cleanup, which restores the flags, before
// it exits.
//
// Usage: ExampleCat [path, default: a 1,000-line file this program writes]

import GCD
import Glibc
import Synchronization

/// Writes `text` to standard error (one `write`, safe from any thread).
func printError(_ text: String) {
  var bytes = Array(text.utf8)
  _ = bytes.withUnsafeMutableBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
}

/// Writes the default input: 1,000 numbered lines in a temporary file.
func writeDefaultInput() -> String {
  var template = Array("/tmp/ExampleCat-XXXXXX".utf8CString)
  let descriptor = mkstemp(&template)
  precondition(descriptor >= 0, "mkstemp: errno \(errno)")
  let text = (1...1000).map { "line \($0) of the default input\n" }.joined()
  let bytes = Array(text.utf8)
  var written = 0
  while written < bytes.count {
    let count = bytes[written...].withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
    precondition(count > 0, "write: errno \(errno)")
    written += count
  }
  close(descriptor)
  return template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
}

/// Resumes a waiting task once, from a cleanup handler.
final class Finished: Sendable {
  private let state = Mutex<(done: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))
  func signal() {
    let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
      state.done = true
      defer { state.waiter = nil }
      return state.waiter
    }
    waiter?.resume()
  }
  func wait() async {
    await withCheckedContinuation { continuation in
      let done = state.withLock { state -> Bool in
        if !state.done { state.waiter = continuation }
        return state.done
      }
      if done { continuation.resume() }
    }
  }
}

let arguments = CommandLine.arguments
let path = arguments.count > 1 ? arguments[1] : writeDefaultInput()
defer { if arguments.count <= 1 { unlink(path) } }

let queue = Queue(label: "cat")
let outputReleased = Finished()
do {
  let input = try IOChannel(path: path, flags: O_RDONLY, type: .stream, queue: queue)
  // Standard output is not ours to close: the cleanup only reports that the channel let go of it.
  let output = IOChannel(fileDescriptor: STDOUT_FILENO, type: .stream, queue: queue) { _ in outputReleased.signal() }
  var copied = 0
  for try await chunk in input.chunks(maximumLength: 64 * 1024) {
    try await output.write(chunk)
    copied += chunk.count
  }
  output.close()
  await outputReleased.wait()
  printError("ExampleCat: copied \(copied) bytes from \(path)\n")
} catch {
  printError("ExampleCat: \(error)\n")
  exit(1)
}
