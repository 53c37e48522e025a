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
    let run = try await ExampleRun("ActorQueue")
    run.expect("calls: 8001, on the actor's queue: 8001, preferring task on the queue: true")
  }

  @Test("GracefulShutdown: a SIGTERM through `for await` stops the service cleanly")
  func gracefulShutdown() async throws {
    let run = try await ExampleRun("GracefulShutdown")
    run.expect("received SIGTERM: shutting down")
    run.expect("served 3 requests, shut down cleanly")
  }

  @Test("FileWatcher: write, rename and delete seen through FileSystemSource events")
  func fileWatcher() async throws {
    let run = try await ExampleRun("FileWatcher")
    run.expect("the source follows the file to its new name: /tmp/gcd-file-watcher-")
    run.expect("the watched file was written, renamed and deleted")
  }

  @Test("Supervisor: the child's exit awaited through ProcSource events, then reaped")
  func supervisor() async throws {
    let run = try await ExampleRun("Supervisor")
    run.expect("exited ([.exit])")
    run.expect("child exit status: 7")
  }

  @Test("MainActorThread: with Queue.dispatchMain { }, main-actor code after each await runs on the main thread")
  func mainActorThread() async throws {
    let run = try await ExampleRun("MainActorThread")
    run.expect("after await run: main thread: true")
    run.expect("after sleep: main thread: true")
    run.expect("called from a detached task: main thread: true")
    #expect(!run.output.contains("main thread: false"))
  }
}
