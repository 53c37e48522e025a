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

// MARK: - The edges of both clocks (issue 25)

/// libdispatch's `DISPATCH_TIME_MAX_VALUE`: its clocks end before 2^62 − 1 ns.
private let maxValue: UInt64 = 1 << 62 - 1

/// The wall-clock deadline `nanoseconds` after the epoch, split as a caller would.
private func wall(_ nanoseconds: Int64) -> Deadline {
  .wallClock(
    secondsSinceEpoch: Int(nanoseconds / 1_000_000_000), nanoseconds: Int(nanoseconds % 1_000_000_000))
}

/// A value below `bound` with a random number of significant bits, so that small, middle and huge
/// values all come up.
private func spread(below bound: UInt64, using random: inout SeededRandom) -> UInt64 {
  let bits = Int.random(in: 1...64, using: &random)
  return (random.next() >> (64 - bits)) % bound
}

/// Runs a property over a seeded generator and expects no failure; the message names the seed
/// that replays the run and the first failures.
private func checkProperty(
  minimumCases: Int = 0, sourceLocation: SourceLocation = #_sourceLocation,
  _ body: (inout SeededRandom, inout [String]) -> Int
) {
  let seed = SeededRandom.runSeed
  var random = SeededRandom(seed: seed)
  var failures: [String] = []
  let cases = body(&random, &failures)
  let failed = failures.count
  #expect(failed == 0, "seed \(seed) (GCD_PROPERTY_SEED): \(failures.prefix(5))", sourceLocation: sourceLocation)
  #expect(cases >= minimumCases, sourceLocation: sourceLocation)
}

extension DeadlineTests {
  @Test("a wall-clock time at or past 2^62 - 1 ns since the epoch (2116-02-20) is forever, not another clock")
  func wallClockPast2116() {
    // dispatch_walltime gave 0xba9c6e7dbb0c0000 here: bit 63 without bit 62, libdispatch's continuous clock.
    let late = Deadline.wallClock(secondsSinceEpoch: 5_000_000_000)
    #expect(late.isForever)
    #expect(late - .seconds(1) <= late)
    #expect(Deadline.wallClock() < late)
    #expect(wall(1 << 62).isForever)
    #expect(wall(Int64(maxValue)).isForever)
    #expect(Deadline.wallClock(secondsSinceEpoch: .max).isForever)
    #expect(Deadline.wallClock(secondsSinceEpoch: 1, nanoseconds: .max).isForever)
    let last = wall(Int64(maxValue) - 1)
    #expect(last.nanosecondsSinceEpoch == maxValue - 1)
    #expect(last - .seconds(1) < last && last < .forever)
    #expect(last + .nanoseconds(1) == .forever)
  }

  @Test("the earliest wall-clock deadline is a real time, not DISPATCH_WALLTIME_NOW: adding to it counts from it")
  func earliestWallClockIsATime() {
    let earliest = Deadline.wallClock() - .seconds(Int64.max)
    #expect(earliest + .seconds(3_600) < Deadline.wallClock())
    #expect(earliest.rawValue != ~1, "~1 is DISPATCH_WALLTIME_NOW")
    #expect(earliest.nanosecondsSinceEpoch == 3)
    #expect(earliest - .nanoseconds(1) == earliest)
    #expect(earliest == .wallClockEarliest)
    // libdispatch turns a wall-clock deadline moved back onto 1 ns into ~0, forever.
    #expect(wall(10) - .nanoseconds(9) == earliest)
    #expect(wall(10) - .nanoseconds(8) == earliest)
    #expect(wall(10) - .nanoseconds(7) == wall(3))
    // Times before it are already due: they become it (not now, not forever).
    #expect(wall(0) == earliest && wall(2) == earliest && wall(-1) == earliest)
    #expect(Deadline.wallClock(secondsSinceEpoch: .min) == earliest)
    #expect(Deadline.wallClock(secondsSinceEpoch: 0, nanoseconds: .min) == earliest)
  }

  @Test("every raw value orders as libdispatch reads it: monotonic, wall clock, continuous, past the end, forever")
  func rawValuesOrderByClock() {
    let expected: [UInt64] = [
      0, 1, maxValue - 1, maxValue,  // bits 00: monotonic (0 is DISPATCH_TIME_NOW)
      ~1, ~2, 0 &- (maxValue - 1), 0 &- maxValue,  // bits 11: wall clock by time (~1 is DISPATCH_WALLTIME_NOW)
      1 << 63, 1 << 63 | 1, 1 << 63 | maxValue,  // bits 10: libdispatch's continuous clock
      1 << 62, 1 << 62 | 1, UInt64(Int64.max), 3 << 62,  // read as past the end of a clock
      ~0,  // forever
    ]
    var random = SeededRandom(seed: 25)
    let deadlines = expected.map(Deadline.init(rawValue:))
    #expect(deadlines.shuffled(using: &random).sorted() == deadlines)
    for (earlier, later) in zip(deadlines, deadlines.dropFirst()) {
      #expect(earlier < later, "\(String(earlier.rawValue, radix: 16)) < \(String(later.rawValue, radix: 16))")
    }
  }

  @Test("< is a strict total order over raw values: irreflexive, transitive, exactly one of <, ==, >")
  func strictTotalOrder() {
    checkProperty(minimumCases: 10_000) { random, failures in
      let edges: [UInt64] = [
        0, 1, 2, maxValue - 1, maxValue, 1 << 62, UInt64(Int64.max), 1 << 63, 1 << 63 | 1, 1 << 63 | maxValue,
        3 << 62, 3 << 62 | 1, 3 << 62 | 2, ~2, ~1, ~0, Deadline.now.rawValue, Deadline.wallClock().rawValue,
      ]
      // Random values, and their neighbours, in each of the four encodings.
      let randoms = (0..<60).flatMap { _ in
        let value = random.next()
        return [value, value &+ 1, value &- 1]
      }
      let values = (edges + randoms).map(Deadline.init(rawValue:))
      for a in values {
        if a < a { failures.append("\(a.rawValue) < itself") }
        for b in values {
          let answers = [a < b, a == b, b < a].filter { $0 }.count
          if answers != 1 { failures.append("\(a.rawValue), \(b.rawValue): \(answers) of <, ==, >") }
          guard a < b else { continue }
          for c in values where b < c && !(a < c) {
            failures.append("\(a.rawValue) < \(b.rawValue) < \(c.rawValue) but not \(a.rawValue) < \(c.rawValue)")
          }
        }
      }
      return values.count * values.count
    }
  }

  @Test("on either clock, d - x <= d <= d + x, exactly, clamped; a wall-clock deadline stays on the wall clock")
  func arithmeticStaysOnItsClock() {
    checkProperty(minimumCases: 5_000) { random, failures in
      let edgeDurations: [UInt64] = [0, 1, 2, 3, maxValue - 1, maxValue, 1 << 62, UInt64(Int64.max)]
      let durations = edgeDurations + (0..<60).map { _ in spread(below: UInt64(Int64.max), using: &random) }
      // What libdispatch makes on each clock: monotonic 1 ..< maxValue, wall clock 3 ..< maxValue ns.
      let monotonicEdges: [UInt64] = [1, 2, 3, maxValue - 2, maxValue - 1, Deadline.now.rawValue]
      let wallEdges: [UInt64] = [3, 4, 5, maxValue - 2, maxValue - 1, Deadline.wallClock().nanosecondsSinceEpoch!]
      let monotonic = monotonicEdges + (0..<60).map { _ in 1 + spread(below: maxValue - 1, using: &random) }
      let wallTimes = wallEdges + (0..<60).map { _ in 3 + spread(below: maxValue - 3, using: &random) }
      var cases = 0
      for x in durations {
        let duration = Duration.nanoseconds(Int64(x))
        for raw in monotonic {
          let d = Deadline(rawValue: raw)
          let later = d + duration
          let earlier = d - duration
          let sum = raw.addingReportingOverflow(x)
          let expectedLater =
            sum.overflow || sum.partialValue >= maxValue ? Deadline.forever : Deadline(rawValue: sum.partialValue)
          let expectedEarlier = Deadline(rawValue: raw > x ? raw - x : 1)
          if !(earlier <= d && d <= later) { failures.append("monotonic \(raw) ± \(x): not ordered") }
          if later != expectedLater || earlier != expectedEarlier {
            failures.append("monotonic \(raw) ± \(x): \(earlier.rawValue), \(later.rawValue)")
          }
          if d + .nanoseconds(-Int64(x)) != earlier { failures.append("monotonic \(raw) + -\(x) != \(raw) - \(x)") }
          cases += 1
        }
        for nanoseconds in wallTimes {
          let d = wall(Int64(nanoseconds))
          let later = d + duration
          let earlier = d - duration
          let sum = nanoseconds.addingReportingOverflow(x)
          let expectedLater =
            sum.overflow || sum.partialValue >= maxValue ? Deadline.forever : wall(Int64(sum.partialValue))
          let expectedEarlier = nanoseconds > x + 3 ? wall(Int64(nanoseconds - x)) : Deadline.wallClockEarliest
          if d.nanosecondsSinceEpoch != nanoseconds { failures.append("wall \(nanoseconds): \(d.rawValue)") }
          if !(earlier <= d && d <= later) { failures.append("wall \(nanoseconds) ± \(x): not ordered") }
          if later != expectedLater || earlier != expectedEarlier {
            failures.append("wall \(nanoseconds) ± \(x): \(earlier.rawValue), \(later.rawValue)")
          }
          for moved in [later, earlier] where !moved.isForever && moved.nanosecondsSinceEpoch.map({ $0 < 3 }) != false {
            failures.append("wall \(nanoseconds) ± \(x) left the wall clock: \(String(moved.rawValue, radix: 16))")
          }
          if d + .nanoseconds(-Int64(x)) != earlier {
            failures.append("wall \(nanoseconds) + -\(x) != \(nanoseconds) - \(x)")
          }
          cases += 1
        }
      }
      return cases
    }
  }

  @Test("wallClock(secondsSinceEpoch:nanoseconds:) round-trips before 2^62 - 1 ns and keeps the order of its input")
  func wallClockRoundTrips() {
    checkProperty(minimumCases: 3_000) { random, failures in
      let edges: [Int64] = [
        .min, -1_000_000_001, -1, 0, 1, 2, 3, 4, 999_999_999, 1_000_000_000, Int64(maxValue) - 1, Int64(maxValue),
        1 << 62, .max,
      ]
      let times =
        (edges + (0..<3_000).map { _ in Int64(bitPattern: random.next()) >> Int.random(in: 0...63, using: &random) })
        .sorted()
      for (nanoseconds, next) in zip(times, times.dropFirst()) {
        let d = wall(nanoseconds)
        switch nanoseconds {
        case ..<3: if d != .wallClockEarliest { failures.append("\(nanoseconds): not the earliest") }
        case ..<Int64(maxValue):
          if d.nanosecondsSinceEpoch != UInt64(nanoseconds) { failures.append("\(nanoseconds): \(d.rawValue)") }
        default: if !d.isForever { failures.append("\(nanoseconds): not forever") }
        }
        if !(d <= wall(next)) { failures.append("\(nanoseconds) ≤ \(next): order") }
      }
      return times.count
    }
  }

  @Test("a raw value libdispatch reads as past the end of a clock moves to forever, as libdispatch moves it")
  func pastTheEndMovesToForever() {
    for raw: UInt64 in [1 << 62, UInt64(Int64.max), 3 << 62] {
      #expect((Deadline(rawValue: raw) + .seconds(1)).isForever)
      #expect((Deadline(rawValue: raw) - .seconds(1)).isForever)
      #expect(Deadline(rawValue: raw) < .forever)
    }
  }
}
