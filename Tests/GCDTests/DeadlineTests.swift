import Testing

@testable import GCD

@Suite("Deadline")
struct DeadlineTests {
  @Test("forever is DISPATCH_TIME_FOREVER and nothing else is")
  func forever() {
    #expect(Deadline.forever.rawValue == UInt64.max)
    #expect(Deadline.forever.isForever)
    #expect(!Deadline.now.isForever)
    #expect(!Deadline.wallClock().isForever)
    #expect(Deadline(rawValue: ~0) == .forever)
  }

  @Test("now advances and never goes back")
  func nowIsMonotonic() {
    var previous = Deadline.now
    for _ in 0..<1_000 {
      let next = Deadline.now
      #expect(next.rawValue >= previous.rawValue)
      previous = next
    }
    #expect(previous.rawValue > 0)
  }

  @Test("adding and subtracting durations moves a monotonic deadline by exactly that many nanoseconds")
  func arithmetic() {
    let start = Deadline.now
    #expect((start + .seconds(1)).rawValue == start.rawValue + 1_000_000_000)
    #expect((start + .milliseconds(5)).rawValue == start.rawValue + 5_000_000)
    #expect((start + .nanoseconds(1)).rawValue == start.rawValue + 1)
    #expect((start - .milliseconds(5)).rawValue == start.rawValue - 5_000_000)
    #expect((start + .milliseconds(-5)).rawValue == start.rawValue - 5_000_000)
    #expect((start - .milliseconds(-5)).rawValue == start.rawValue + 5_000_000)
    #expect(start + .zero == start)
    #expect((start + .seconds(3)) - .seconds(3) == start)
    var moved = start
    moved += .microseconds(7)
    #expect(moved.rawValue == start.rawValue + 7_000)
  }

  @Test("adding past the end of the clock clamps to forever instead of trapping")
  func clampsToForever() {
    #expect((Deadline.now + .seconds(Int64.max)).isForever)
    #expect((Deadline.now + .nanoseconds(Int64.max)).isForever)
    #expect(
      (Deadline.now + Duration(secondsComponent: Int64.max, attosecondsComponent: 999_999_999_999_999_999)).isForever)
    #expect((Deadline.now - .seconds(Int64.min)).isForever)
    #expect((Deadline.now - .nanoseconds(Int64.min)).isForever)
    #expect((Deadline.wallClock() + .seconds(Int64.max)).isForever)
  }

  @Test("forever stays forever whatever is added or subtracted")
  func foreverIsAbsorbing() {
    #expect((Deadline.forever + .seconds(1)).isForever)
    #expect((Deadline.forever - .seconds(1)).isForever)
    #expect((Deadline.forever - .seconds(Int64.max)).isForever)
    #expect((Deadline.forever + .seconds(Int64.min)).isForever)
  }

  @Test("subtracting past the start of the clock clamps to the earliest time, not to now or forever")
  func clampsToEarliest() {
    let now = Deadline.now
    let earliest = now - .seconds(Int64.max)
    #expect(!earliest.isForever)
    #expect(earliest.rawValue != 0)  // 0 is DISPATCH_TIME_NOW
    #expect(earliest.rawValue < now.rawValue)
    #expect(now + .seconds(Int64.min) == earliest)
    let wallEarliest = Deadline.wallClock() - .seconds(Int64.max)
    #expect(!wallEarliest.isForever)
  }

  @Test("clamped deadlines work as timeouts: the past returns at once")
  func clampedDeadlinesAsTimeouts() throws {
    let semaphore = try Semaphore(value: 0)
    #expect(!semaphore.wait(deadline: .now - .seconds(Int64.max)))
    #expect(!semaphore.wait(deadline: .wallClock() - .seconds(Int64.max)))
    let group = Group()
    group.enter()
    #expect(!group.wait(deadline: .now + .seconds(Int64.min)))
    group.leave()
  }

  @Test("wallClock(secondsSinceEpoch:nanoseconds:) is consistent with duration arithmetic")
  func wallClockFromEpoch() {
    let second = Deadline.wallClock(secondsSinceEpoch: 1_000_000_000)
    #expect(second + .seconds(1) == Deadline.wallClock(secondsSinceEpoch: 1_000_000_001))
    #expect(second + .milliseconds(1) == Deadline.wallClock(secondsSinceEpoch: 1_000_000_000, nanoseconds: 1_000_000))
    #expect(second - .seconds(1) == Deadline.wallClock(secondsSinceEpoch: 999_999_999))
    #expect(!second.isForever)
    #expect(Deadline.wallClock(secondsSinceEpoch: 1) + .seconds(1) == Deadline.wallClock(secondsSinceEpoch: 2))
  }

  @Test("wallClock() is now on the wall clock: a past epoch time is already due, a future one not yet")
  func wallClockNow() throws {
    let semaphore = try Semaphore(value: 0)
    let future = Deadline.wallClock(secondsSinceEpoch: Int(wallClockNanoseconds() / 1_000_000_000) + 3_600)
    #expect(!semaphore.wait(deadline: Deadline.wallClock(secondsSinceEpoch: 1_000_000_000)))
    semaphore.signal()
    #expect(semaphore.wait(deadline: future))
    #expect(Deadline.wallClock() + .seconds(3_600) != Deadline.now + .seconds(3_600))
  }

  // dispatch_walltime turns any time at or before 1 ns after the epoch
  // into DISPATCH_TIME_FOREVER, so the deadline "1970-01-01" never comes and
  // a wait on it never returns. A time in the past should be due at once.
  @Test("wallClock(secondsSinceEpoch: 0) is a time in the past, not forever")
  func wallClockAtEpoch() {
    #expect(!Deadline.wallClock(secondsSinceEpoch: 0).isForever)
    #expect(!Deadline.wallClock(secondsSinceEpoch: -1).isForever)
    // Already due: a semaphore wait on it times out at once.
    let semaphore = try! Semaphore(value: 0)
    #expect(!semaphore.wait(deadline: .wallClock(secondsSinceEpoch: 0)))
  }

  @Test("Deadline is Hashable by raw value")
  func hashable() {
    let deadline = Deadline.now
    let set: Set<Deadline> = [deadline, Deadline(rawValue: deadline.rawValue), .forever]
    #expect(set.count == 2)
    #expect(Deadline(rawValue: 42) == Deadline(rawValue: 42))
    #expect(Deadline(rawValue: 42) != Deadline(rawValue: 43))
  }

  // MARK: - Duration.saturatingNanoseconds (internal: the one conversion every Duration goes through)

  @Test(
    "saturatingNanoseconds converts exactly inside Int64's range",
    arguments: [
      (Duration.zero, Int64(0)),
      (.nanoseconds(1), 1),
      (.nanoseconds(-1), -1),
      (.microseconds(3), 3_000),
      (.milliseconds(-250), -250_000_000),
      (.seconds(1), 1_000_000_000),
      (.seconds(-90), -90_000_000_000),
      (.nanoseconds(Int64.max), Int64.max),
      (.nanoseconds(Int64.min), Int64.min),
      (.seconds(9_223_372_036), 9_223_372_036_000_000_000),
      (.seconds(-9_223_372_036), -9_223_372_036_000_000_000),
    ])
  func saturatingNanosecondsExact(duration: Duration, nanoseconds: Int64) {
    #expect(duration.saturatingNanoseconds == nanoseconds)
  }

  @Test("saturatingNanoseconds truncates sub-nanosecond parts toward zero")
  func saturatingNanosecondsTruncates() {
    #expect(Duration(secondsComponent: 0, attosecondsComponent: 999_999_999).saturatingNanoseconds == 0)
    #expect(Duration(secondsComponent: 0, attosecondsComponent: 1_999_999_999).saturatingNanoseconds == 1)
    #expect(Duration(secondsComponent: 0, attosecondsComponent: -1_999_999_999).saturatingNanoseconds == -1)
    #expect((Duration.nanoseconds(5) / 2).saturatingNanoseconds == 2)
  }

  @Test(
    "saturatingNanoseconds clamps outside Int64's range instead of trapping",
    arguments: [
      (Duration.seconds(Int64.max), Int64.max),
      (.seconds(Int64.min), Int64.min),
      (.seconds(9_223_372_037), Int64.max),
      (.seconds(-9_223_372_037), Int64.min),
      (.nanoseconds(Int64.max) + .nanoseconds(1), Int64.max),
      (.nanoseconds(Int64.min) - .nanoseconds(1), Int64.min),
      (Duration(secondsComponent: 9_223_372_036, attosecondsComponent: 999_999_999_999_999_999), Int64.max),
      (Duration(secondsComponent: -9_223_372_036, attosecondsComponent: -999_999_999_999_999_999), Int64.min),
    ])
  func saturatingNanosecondsClamps(duration: Duration, nanoseconds: Int64) {
    #expect(duration.saturatingNanoseconds == nanoseconds)
  }

  // MARK: - Every entry point that takes a Duration saturates (issue 17)

  @Test(
    "every entry point that takes a Duration saturates: huge ones mean practically never, huge negative ones now",
    arguments: [Duration.seconds(Int64.max / 4), .seconds(Int64.max), .seconds(Int64.min), .seconds(-Int64.max / 4)])
  func hugeDurations(duration: Duration) {
    let never = duration > .zero
    #expect((Deadline.now + duration).isForever == never)
    #expect((Deadline.now - duration).isForever == !never)
    var moved = Deadline.now
    moved += duration
    #expect(moved.isForever == never)
    #expect(Group().wait(timeout: duration))
    let semaphore = try! Semaphore(value: 1)
    #expect(semaphore.wait(timeout: duration))
    // Taken: a negative timeout is "now" and gives up at once (a huge one would wait practically forever).
    if !never { #expect(!semaphore.wait(timeout: duration)) }
    let item = WorkItem {}
    item.perform()
    #expect(item.wait(timeout: duration))
    let queue = Queue(label: "huge-durations")
    let ran = Event()
    let later = queue.after(duration) { ran.signal() }
    let laterItem = WorkItem { ran.signal() }
    queue.after(duration, laterItem)
    if never {
      #expect(!ran.wait(timeout: briefTimeout))
      later.cancel()
      laterItem.cancel()
    } else {
      #expect(ran.wait())
    }
    let timer = TimerSource(queue: queue)
    let fired = Event()
    timer.setEventHandler { fired.signal() }
    timer.schedule(start: .now + duration, interval: never ? duration : nil, leeway: duration)
    timer.resume()
    #expect(fired.wait(timeout: never ? briefTimeout : generousTimeout) != never)
    timer.cancel()
  }
}

// MARK: - Comparable

extension DeadlineTests {
  @Test("deadlines on one clock order by time, forever last; the order is total")
  func ordering() {
    let now = Deadline.now
    #expect(now < now + .milliseconds(1))
    #expect(now - .seconds(1) < now)
    #expect(!(now < now) && now <= now)
    #expect(now + .seconds(Int64.max) == .forever, "saturated: no later deadline than forever")
    #expect(now < .forever && Deadline.wallClock() < .forever)
    let wall = Deadline.wallClock(secondsSinceEpoch: 1_000_000_000)
    #expect(wall < Deadline.wallClock(secondsSinceEpoch: 1_000_000_001))
    #expect(wall < Deadline.wallClock())
    let mixed = [Deadline.forever, wall, now + .seconds(5), now, Deadline.wallClock()]
    let sorted = mixed.sorted()
    #expect(sorted.last == .forever)
    #expect(sorted.firstIndex(of: now)! < sorted.firstIndex(of: now + .seconds(5))!)
    #expect(sorted.firstIndex(of: wall)! < sorted.firstIndex(of: .forever)!)
    #expect(mixed.max() == .forever && mixed.min().map { $0 == now || $0 == wall } == true)
  }
}
