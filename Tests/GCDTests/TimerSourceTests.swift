import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

@Suite("TimerSource")
struct TimerSourceTests {
  @Test("a repeating timer fires exactly 3 times when its handler cancels it at the third")
  func repeatingFiresThreeTimes() {
    let queue = Queue(label: "timer.repeating")
    let timer = TimerSource(queue: queue)
    let fires = Counter()
    let cancelled = Event()
    timer.setEventHandler { [unowned timer] in
      if fires.increment() == 3 { timer.cancel() }
    }
    timer.setCancelHandler { cancelled.signal() }
    timer.schedule(start: .now, interval: .milliseconds(5))
    timer.resume()
    #expect(cancelled.wait())
    queue.sync {}
    #expect(fires.current == 3)
    #expect(timer.isCancelled)
  }

  @Test("a one-shot timer fires once, with a fire count of 1")
  func oneShotFiresOnce() {
    let counts = oneShotFireCounts(on: Queue(label: "timer.oneshot"), start: .now + .milliseconds(10)) {
      // A second fire, if there were one, would be due at once; give it time to show.
      letTimePass(briefTimeout)
    }
    #expect(counts == [1])
  }

  @Test("a suspended timer merges its ticks: the first event after resume stands for several fires")
  func suspendedTimerMergesTicks() {
    let queue = Queue(label: "timer.suspended")
    let timer = TimerSource(queue: queue)
    let counts = Recorder<UInt>()
    let firstFire = Event()
    let fireAfterResume = Event()
    let resumedAt = Atomic<Int>(-1)
    timer.setEventHandler { [unowned timer] in
      counts.append(timer.fireCount)
      firstFire.signal()
      let mark = resumedAt.load(ordering: .acquiring)
      if mark >= 0 && counts.count > mark { fireAfterResume.signal() }
    }
    timer.schedule(start: .now, interval: .milliseconds(10))
    timer.resume()
    #expect(firstFire.wait())
    timer.suspend()
    queue.sync {}  // a handler already running has finished
    let before = counts.count
    // At least 10 intervals pass while the timer is suspended.
    letTimePass(.milliseconds(100))
    #expect(counts.count == before, "a handler ran while the timer was suspended")
    resumedAt.store(before, ordering: .releasing)
    timer.resume()
    #expect(fireAfterResume.wait())
    timer.cancel()
    queue.sync {}
    let values = counts.values
    guard values.count > before else { return }
    #expect(values[before] >= 2, "first event after resume stands for \(values[before]) fire(s); 10 intervals passed")
  }

  @Test("scheduling again replaces the schedule of an active timer")
  func reschedulingAnActiveTimer() {
    let queue = Queue(label: "timer.reschedule")
    let timer = TimerSource(queue: queue)
    let fired = Event()
    let fires = Counter()
    timer.setEventHandler {
      fires.increment()
      fired.signal()
    }
    timer.schedule(start: .now + .seconds(3600), interval: .seconds(3600))
    timer.resume()
    queue.sync {}
    #expect(fires.current == 0)
    timer.schedule(start: .now + .milliseconds(5))
    #expect(fired.wait(), "the new schedule did not fire; the old one (in an hour) was kept")
    timer.cancel()
  }

  @Test("a timer started on the wall clock fires, at once for a start in the past")
  func wallClockStart() {
    let queue = Queue(label: "timer.wallclock")
    for start in [Deadline.wallClock() + .milliseconds(20), Deadline.wallClock() - .seconds(60)] {
      let counts = oneShotFireCounts(on: queue, start: start, leeway: .milliseconds(1))
      #expect(counts == [1])
    }
  }

  @Test("a repeating wall-clock timer fires repeatedly")
  func repeatingWallClock() {
    let timer = TimerSource(queue: .global())
    let fires = Latch(count: 3)
    timer.setEventHandler { fires.signal() }
    timer.schedule(start: .wallClock(), interval: .milliseconds(5))
    timer.resume()
    #expect(fires.wait())
    timer.cancel()
  }

  @Test("handlers run on the timer's queue; setTarget moves later fires")
  func handlersRunOnTheQueue() {
    let first = Queue(label: "timer.first")
    let second = Queue(label: "timer.second")
    let timer = TimerSource(queue: first)
    let ranOn = Recorder<String>()
    let fired = Event()
    let firedAgain = Event()
    timer.setEventHandler {
      ranOn.append("first \(first.isCurrent), second \(second.isCurrent)")
      if fired.isSignaled { firedAgain.signal() } else { fired.signal() }
    }
    timer.schedule(start: .now)
    timer.resume()
    #expect(fired.wait())
    first.sync {}
    timer.setTarget(second)
    timer.schedule(start: .now)
    #expect(firedAgain.wait())
    #expect(ranOn.values == ["first true, second false", "first false, second true"])
    timer.cancel()
  }

  @Test("the registration handler runs once, before the first fire; the cancel handler once")
  func registrationAndCancelHandlers() {
    let queue = Queue(label: "timer.handlers")
    let timer = TimerSource(queue: queue)
    let order = Recorder<String>()
    let fires = Latch(count: 3)
    let cancelled = Event()
    timer.setRegistrationHandler { order.append("registration") }
    timer.setEventHandler {
      if fires.count > 0 { order.append("fire") }
      fires.signal()
    }
    timer.setCancelHandler {
      order.append("cancel")
      cancelled.signal()
    }
    timer.schedule(start: .now, interval: .milliseconds(5))
    timer.resume()
    #expect(fires.wait())
    timer.cancel()
    timer.cancel()
    #expect(cancelled.wait())
    queue.sync {}
    let values = order.values
    #expect(values.first == "registration")
    #expect(values.last == "cancel")
    #expect(values.filter { $0 == "registration" }.count == 1)
    #expect(values.filter { $0 == "cancel" }.count == 1)
    #expect(values.filter { $0 == "fire" }.count == 3)
  }

  @Test("a zero interval stops the process with a message")
  func zeroIntervalStops() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let timer = TimerSource(queue: .global())
      timer.schedule(start: .now, interval: .zero)
    }
    #expect(standardError(of: result).contains("the interval must be at least 1 nanosecond"))
  }

  @Test("an interval under 1 ns stops the process with a message")
  func subNanosecondIntervalStops() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let timer = TimerSource(queue: .global())
      timer.schedule(start: .now, interval: .nanoseconds(0.5))
    }
    #expect(standardError(of: result).contains("the interval must be at least 1 nanosecond"))
  }
}

/// A one-shot timer on `queue` from `start`, resumed: expects it to fire, then runs `afterFire`,
/// drains `queue` and cancels the timer. Returns the fire counts its handler saw.
private func oneShotFireCounts(
  on queue: Queue, start: Deadline, leeway: Duration = .zero, sourceLocation: SourceLocation = #_sourceLocation,
  afterFire: () -> Void = {}
) -> [UInt] {
  let timer = TimerSource(queue: queue)
  let counts = Recorder<UInt>()
  let fired = Event()
  timer.setEventHandler { [unowned timer] in
    counts.append(timer.fireCount)
    fired.signal()
  }
  timer.schedule(start: start, leeway: leeway)
  timer.resume()
  #expect(fired.wait(), sourceLocation: sourceLocation)
  afterFire()
  queue.sync {}
  let values = counts.values
  timer.cancel()
  return values
}
