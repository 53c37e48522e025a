// A Linux service with GCD, step 1: the work runs on the service's own serial queue,
// once a second.
import GCD
import Glibc

let work = Queue(label: "com.example.service")

let heartbeat = TimerSource(queue: work)
heartbeat.schedule(start: .now, interval: .seconds(1), leeway: .milliseconds(100))
heartbeat.setEventHandler {
  print("service: tick")
}
heartbeat.resume()

dispatchMain()
