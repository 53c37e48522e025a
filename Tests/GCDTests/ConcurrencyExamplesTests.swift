import GCD
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The Swift-concurrency examples (Examples/ActorQueue, GracefulShutdown,
/// FileWatcher, Supervisor, MainActorThread): each must exit 0 by itself
/// and print what it proves.
@Suite("Concurrency examples")
struct ConcurrencyExamplesTests {
  @Test("ActorQueue: 8 callers, every actor call on the actor's queue, the preferring task on the queue")
  func actorQueue() async throws {
    let run = try await ConcurrencyExampleRun("ActorQueue")
    run.expect("calls: 8001, on the actor's queue: 8001, preferring task on the queue: true")
  }

  @Test("GracefulShutdown: a SIGTERM through `for await` stops the service cleanly")
  func gracefulShutdown() async throws {
    let run = try await ConcurrencyExampleRun("GracefulShutdown")
    run.expect("received SIGTERM: shutting down")
    run.expect("served 3 requests, shut down cleanly")
  }

  @Test("FileWatcher: write, rename and delete seen through FileSystemSource events")
  func fileWatcher() async throws {
    let run = try await ConcurrencyExampleRun("FileWatcher")
    run.expect("the source follows the file to its new name: /tmp/gcd-file-watcher-")
    run.expect("the watched file was written, renamed and deleted")
  }

  @Test("Supervisor: the child's exit awaited through ProcSource events, then reaped")
  func supervisor() async throws {
    let run = try await ConcurrencyExampleRun("Supervisor")
    run.expect("exited ([.exit])")
    run.expect("child exit status: 7")
  }

  @Test("MainActorThread: with dispatchMain { }, main-actor code after each await runs on the main thread")
  func mainActorThread() async throws {
    let run = try await ConcurrencyExampleRun("MainActorThread")
    run.expect("after await run: main thread: true")
    run.expect("after sleep: main thread: true")
    run.expect("called from a detached task: main thread: true")
    #expect(!run.output.contains("main thread: false"))
  }
}

/// Runs `Example<name>` (built next to the test bundle) with its standard
/// output in a temporary file; records an issue unless it exits 0 within a minute.
private struct ConcurrencyExampleRun {
  let name: String
  let output: String

  init(_ name: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
    self.name = name
    let path = try #require(
      examplePath("Example\(name)"), "Example\(name) is not built", sourceLocation: sourceLocation)
    var template = Array("/tmp/gcd-concurrency-example-XXXXXX".utf8CString)
    let outputFD = mkstemp(&template)
    try #require(outputFD >= 0)
    let outputPath = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    defer {
      close(outputFD)
      unlink(outputPath)
    }
    // Standard output to the file (the examples print there, "FAILED" included); default
    // dispositions and no blocked signals, whatever the test runner's threads have.
    let pid = try spawnProcess(path, stdout: outputFD)

    let deadline = ContinuousClock.now + .seconds(60)
    var status: Int32 = 0
    var timedOut = false
    while waitpid(pid, &status, WNOHANG) != pid {
      if ContinuousClock.now >= deadline {
        timedOut = true
        kill(pid, SIGKILL)
        _ = waitpid(pid, &status, 0)
        break
      }
      try await Task.sleep(for: .milliseconds(10))
    }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    lseek(outputFD, 0, SEEK_SET)
    while case let count = read(outputFD, &chunk, chunk.count), count > 0 { bytes += chunk[..<count] }
    output = String(decoding: bytes, as: UTF8.self)
    #expect(!timedOut, "Example\(name) did not exit in time:\n\(output)", sourceLocation: sourceLocation)
    #expect(status == 0, "Example\(name) ended with wait status \(status):\n\(output)", sourceLocation: sourceLocation)
  }

  func expect(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(
      output.contains(text), "Example\(name) did not print \"\(text)\":\n\(output)", sourceLocation: sourceLocation)
  }
}
