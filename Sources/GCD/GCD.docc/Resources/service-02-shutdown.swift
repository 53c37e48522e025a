// A Linux service with GCD, step 2: SIGTERM stops the service gracefully. Every source leaves a
// group from its cancel handler; when all have, the process exits.
import GCD
import Glibc

let work = Queue(label: "com.example.service")
let running = Group()

let heartbeat = TimerSource(queue: work)
heartbeat.schedule(start: .now, interval: .seconds(1), leeway: .milliseconds(100))
heartbeat.setEventHandler {
  print("service: tick")
}
running.enter()
heartbeat.setCancelHandler {
  print("service: timer stopped")
  running.leave()
}
heartbeat.resume()

// libdispatch reads SIGTERM from a signalfd once a source exists: ignore its default action first.
signal(SIGTERM, SIG_IGN)
let terminate = try SignalSource(signal: SIGTERM, queue: work)
terminate.setEventHandler {
  print("service: SIGTERM, shutting down")
  heartbeat.cancel()
  terminate.cancel()
}
running.enter()
terminate.setCancelHandler { running.leave() }
terminate.resume()

running.notify(on: .main) {
  print("service: stopped")
  exit(0)
}
dispatchMain()
