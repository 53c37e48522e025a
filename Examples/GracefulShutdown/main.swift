// A service that shuts down gracefully on SIGTERM: it does its work in a
// task, and the main task waits for SIGTERM with a `for await` over the
// signals. When the signal comes, it stops the worker, lets it finish what
// it is doing, and exits 0.
//
// (The example sends itself the SIGTERM an orchestrator would send, with
// `kill(getpid(), …)`: on Linux a thread-directed `raise` never reaches a
// signal source.)
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Harmless until the signal source is registered (then libdispatch takes it over).
signal(SIGTERM, SIG_IGN)

let queue = Queue(label: "service")
let handled = try await SignalSource.withSignals([SIGTERM, SIGINT], queue: queue) { signals in
  // The sources are registered: from here no SIGTERM is lost.
  let worker = Task {
    var requests = 0
    while !Task.isCancelled {
      requests += 1  // serve a request
      if requests == 3 { kill(getpid(), SIGTERM) }  // the orchestrator asks us to stop
      // Until the next request; after the third, until the shutdown (the cancellation ends the sleep).
      try? await Task.sleep(for: requests < 3 ? .milliseconds(10) : .seconds(60))
    }
    return requests
  }
  for await signal in signals {
    print("received \(signal == SIGTERM ? "SIGTERM" : "SIGINT"): shutting down")
    break
  }
  worker.cancel()
  return await worker.value
}
print("served \(handled) requests, shut down cleanly")
