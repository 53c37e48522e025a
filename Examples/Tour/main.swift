// The README's and the landing page's tour, compiled: a serial queue, four tasks in a group, a value
// back from `sync`, and a timer that ticks three times before it is dropped (which cancels it). The
// lines between the `docs:` markers are what the README shows (docs/docc-listings.sh checks them).
//
// Usage: ExampleTour

// docs: begin tour
import GCD

let queue = Queue(label: "com.example.work")  // serial
let group = Group()
for i in 0..<4 { group.async(on: .global()) { print("task \(i) ran") } }
group.wait()  // or group.notify(on: queue) { }
let answer = queue.sync { 6 * 7 }  // no allocation
print("the answer from the queue: \(answer)")

let ticked = try Semaphore(value: 0)  // -1 would throw
let timer = TimerSource(queue: queue)
timer.schedule(start: .now, interval: .milliseconds(10))
timer.setEventHandler { ticked.signal() }
timer.resume()
for _ in 1...3 { ticked.wait() }
print("three ticks; dropping the timer cancels it")
// docs: end tour
