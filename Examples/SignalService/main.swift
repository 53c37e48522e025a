// A service that makes its signal sequence when it starts and consumes it
// later, in a child task beside its work (a task group): SIGHUP reloads,
// SIGTERM or SIGINT shuts it down cleanly. `SignalSource.sequence(of:)`
// registers the sources at the call, so a signal sent between the start
// and the first `next()` is kept, not lost to the default action.
//
// Run alone, it sends itself a SIGHUP right after the start and a SIGTERM
// once the reload is done (with `kill(getpid(), …)`: on Linux a
// thread-directed `raise` never reaches a signal source). With
// `--external` it waits for the signals from outside (ExamplesTests sends
// them).
import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

let external = CommandLine.arguments.contains("--external")

/// Prints a line at once (unbuffered): a reader of a pipe sees each line when it is printed.
func say(_ text: String) {
  var line = text + "\n"
  line.withUTF8 { _ = write(STDOUT_FILENO, $0.baseAddress, $0.count) }
}

// Harmless until the sources register (then libdispatch takes them over).
for number in [SIGHUP, SIGTERM, SIGINT] { signal(number, SIG_IGN) }

// docs: begin service
final class Service: Sendable {
  let signals: SignalSource.SignalSequence
  let reloads = Atomic(0)

  init() throws(GCDError) {
    // Registered here: from now on no SIGHUP, SIGTERM or SIGINT is lost.
    signals = try SignalSource.sequence(of: [SIGHUP, SIGTERM, SIGINT])
  }

  /// Serves until SIGTERM or SIGINT; returns the requests served.
  func run(work: @escaping @Sendable (Int) -> Void) async throws -> Int {
    try await withThrowingTaskGroup(of: Int?.self) { group in
      group.addTask { [self] in  // the signals, consumed in a child task
        for await signal in signals {
          if signal == SIGHUP {
            say("reload \(reloads.add(1, ordering: .relaxed).newValue)")
            continue
          }
          say("received \(signal == SIGTERM ? "SIGTERM" : "SIGINT"): shutting down")
          return nil
        }
        return nil
      }
      group.addTask {  // the service's work: one request at least, then until the group is cancelled
        var requests = 0
        repeat {
          requests += 1
          work(requests)
          try? await Task.sleep(for: .milliseconds(5))
        } while !Task.isCancelled
        return requests
      }
      _ = try await group.next()  // the signal task ends first: shut the work down
      group.cancelAll()
      var served = 0
      while let result = try await group.next() { served = result ?? served }
      return served
    }
  }
}
// docs: end service

/// The first line, which an orchestrator (the example's test) reads the pid from.
func announceStart() { say("started, pid \(getpid())") }

let service = try Service()
// In a function: a string made by interpolation in top-level code before its first `await` was
// never released (LeakSanitizer, `make sanitize`).
announceStart()
if !external { kill(getpid(), SIGHUP) }  // before anyone iterates: kept
let asked = Atomic(false)
let served = try await service.run { _ in
  // Alone: the orchestrator asks to stop once the reload is done.
  if !external && service.reloads.load(ordering: .relaxed) == 1
    && !asked.exchange(true, ordering: .relaxed)
  {
    kill(getpid(), SIGTERM)
  }
}
say("served \(served > 0 ? "some" : "no") requests, shut down cleanly")
