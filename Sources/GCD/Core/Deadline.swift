/// A point in time for libdispatch: on the monotonic clock (`now`) or on the
/// wall clock (`wallClock()`), or `forever`.
///
/// Adding a `Duration` clamps instead of overflowing: a deadline that would
/// pass the end of its clock becomes `forever`, one before the start becomes
/// the earliest time on its clock (1 ns of uptime; 3 ns after the epoch). A
/// deadline stays on its clock. libdispatch's clocks end at
/// `DISPATCH_TIME_MAX_VALUE`, 2^62 − 1 ns: on the wall clock that is
/// 2116-02-20, and a later wall-clock time is `forever`.
///
/// `<` is a strict total order over every raw value, so deadlines sort and
/// serve as keys; it means "earlier" only within one clock. Deadlines order by
/// clock first, as libdispatch reads the two high bits of the value: monotonic
/// (`00`), then wall clock (`11`), then libdispatch's continuous clock (`10`,
/// which the package does not make), then values libdispatch reads as past
/// the end of a clock and treats as `forever` (`01`, and `0xC000_0000_0000_0000`),
/// then `forever` last. Within a clock they order by time. A monotonic and a
/// wall-clock deadline are not comparable in time (the clocks drift apart):
/// every monotonic deadline orders before every wall-clock one, which says
/// nothing about which comes first.
///
/// Two raw values are libdispatch's sentinels for "the current time", read
/// when the deadline is used: `0` (`DISPATCH_TIME_NOW`, the earliest
/// monotonic value) and `~1` (`DISPATCH_WALLTIME_NOW`, ordered as 2 ns after
/// the epoch). No operation here makes them; a `Duration` added to one counts
/// from now, as libdispatch counts.
///
/// The corresponding C type is `dispatch_time_t`.
public struct Deadline: Hashable, Comparable, Sendable {
  /// The `dispatch_time_t` value.
  public var rawValue: UInt64

  /// A deadline from a `dispatch_time_t` value.
  @inlinable
  public init(rawValue: UInt64) { self.rawValue = rawValue }

  /// The current time on the monotonic clock, which does not advance while
  /// the machine sleeps. The corresponding C call is `dispatch_time(DISPATCH_TIME_NOW, 0)`.
  @inlinable
  public static var now: Deadline { Deadline(rawValue: Libdispatch.time(0, 0)) }

  /// A time that never comes. The corresponding C constant is `DISPATCH_TIME_FOREVER`.
  public static let forever = Deadline(rawValue: Libdispatch.timeForever)

  /// The current time on the wall clock (`gettimeofday`), which follows
  /// changes to the system clock.
  ///
  /// The corresponding C call is `dispatch_walltime(NULL, 0)`.
  @inlinable
  public static func wallClock() -> Deadline { Deadline(walltime: Libdispatch.walltime(0)) }

  /// The wall-clock time `seconds` (and `nanoseconds`) after the Unix epoch.
  ///
  /// - Parameters:
  ///   - seconds: Whole seconds since 1970-01-01 00:00:00 UTC.
  ///   - nanoseconds: The nanoseconds past `seconds`.
  ///
  /// The corresponding C call is `dispatch_walltime(&timespec, 0)`.
  /// A time at or past 2^62 − 1 ns (2116-02-20), where libdispatch's wall
  /// clock ends, is `forever`. libdispatch returns `forever` for a time at or
  /// before the epoch too; such a time has long passed, so any time before
  /// 3 ns after the epoch becomes the earliest wall-clock deadline (3 ns after
  /// the epoch: a deadline that is already due) instead.
  public static func wallClock(secondsSinceEpoch seconds: Int, nanoseconds: Int = 0) -> Deadline {
    let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
    if overflow { return seconds < 0 ? .wallClockEarliest : .forever }
    let (total, overflow2) = scaled.addingReportingOverflow(nanoseconds)
    if overflow2 { return nanoseconds < 0 ? .wallClockEarliest : .forever }
    if total < 3 { return .wallClockEarliest }
    return Deadline(walltime: Libdispatch.walltime(seconds: seconds, nanoseconds: nanoseconds))
  }

  /// The earliest wall-clock deadline, 3 ns after the epoch: a time that has long passed, one
  /// step short of `DISPATCH_WALLTIME_NOW` (2 ns), which libdispatch reads as now.
  @usableFromInline static let wallClockEarliest = Deadline(rawValue: ~2)

  /// A `dispatch_walltime` result, with a time at or past `DISPATCH_TIME_MAX_VALUE` as `forever`:
  /// libdispatch negates the nanoseconds without checking them, and from 2^62 ns on the result
  /// has bit 63 without bit 62, which libdispatch reads as its continuous clock.
  @inlinable
  init(walltime raw: UInt64) {
    rawValue = raw > 0 &- Libdispatch.timeMaxValue ? raw : Libdispatch.timeForever
  }

  /// For a wall-clock deadline, its nanoseconds since the epoch (libdispatch stores them negated).
  @inlinable
  var nanosecondsSinceEpoch: UInt64? {
    guard rawValue >> 62 == 0b11, !isForever, 0 &- rawValue <= Libdispatch.timeMaxValue else { return nil }
    return 0 &- rawValue
  }

  /// Whether `lhs` comes before `rhs`: by clock, then by time (see ``Deadline``).
  @inlinable
  public static func < (lhs: Deadline, rhs: Deadline) -> Bool { lhs.order < rhs.order }

  /// The deadline as (clock, time) in an order that sorts as deadlines do, read as libdispatch
  /// reads it (`_dispatch_time_to_clock_and_value`, src/shims/time.h): bits 63 and 62 `00` are
  /// nanoseconds of uptime, `11` wall-clock nanoseconds since the epoch negated, `10` the
  /// continuous clock's nanoseconds with bit 63 set; a value past `DISPATCH_TIME_MAX_VALUE`
  /// (`01`, or the wall clock's `0xC000_0000_0000_0000`) is past the end of its clock.
  @inlinable
  var order: (clock: UInt8, time: UInt64) {
    if isForever { return (4, 0) }
    if let nanoseconds = nanosecondsSinceEpoch { return (1, nanoseconds) }
    switch rawValue >> 62 {
    case 0b00: return (0, rawValue)
    case 0b10: return (2, rawValue)
    default: return (3, rawValue)
    }
  }

  /// Whether this is `Deadline.forever`, the deadline that never passes.
  @inlinable
  public var isForever: Bool { rawValue == Libdispatch.timeForever }

  /// The deadline moved by `duration` (clamped). The corresponding C function is `dispatch_time`.
  @inlinable
  public static func + (lhs: Deadline, rhs: Duration) -> Deadline { lhs.moved(by: rhs.saturatingNanoseconds) }

  /// The deadline moved back by `duration` (clamped).
  @inlinable
  public static func - (lhs: Deadline, rhs: Duration) -> Deadline {
    let nanos = rhs.saturatingNanoseconds
    return lhs.moved(by: nanos == .min ? .max : -nanos)
  }

  /// Moves the deadline by `duration` (clamped).
  @inlinable
  public static func += (lhs: inout Deadline, rhs: Duration) { lhs = lhs + rhs }

  /// `dispatch_time(rawValue, nanoseconds)`, kept on the wall clock: libdispatch saturates a
  /// wall-clock deadline moved back past its start to `DISPATCH_WALLTIME_NOW` (2 ns), which it
  /// reads as now, and turns one moved back onto 1 ns into `forever` (`~0`); both become the
  /// earliest wall-clock deadline.
  @inlinable
  func moved(by nanoseconds: Int64) -> Deadline {
    let moved = Libdispatch.time(rawValue, nanoseconds)
    if nanoseconds < 0, moved >= Libdispatch.walltimeNow, nanosecondsSinceEpoch != nil { return .wallClockEarliest }
    return Deadline(rawValue: moved)
  }
}

extension Duration {
  /// This duration in whole nanoseconds, saturated at `Int64.min` and
  /// `Int64.max` (about 292 years: "practically never") instead of trapping.
  /// Every `Duration` the package hands to libdispatch goes through here.
  @inlinable
  var saturatingNanoseconds: Int64 {
    // `attoseconds` rather than `components`, whose 128-bit division and remainder by 10^18 cost
    // a few hundred instructions a call (callgrind, the `timers` scale row); a duration under
    // about 9.2 s divides in 64 bits.
    let attoseconds = self.attoseconds
    if let small = Int64(exactly: attoseconds) { return small / 1_000_000_000 }
    let nanoseconds = attoseconds / 1_000_000_000
    return Int64(exactly: nanoseconds) ?? (attoseconds < 0 ? .min : .max)
  }

  /// ``saturatingNanoseconds``, with a negative duration as 0: for the
  /// libdispatch parameters that are unsigned (intervals, leeways).
  @inlinable
  var saturatingNonNegativeNanoseconds: UInt64 { UInt64(max(0, saturatingNanoseconds)) }
}

/// The deadline `timeout` from now: the form every `wait(timeout:)` uses.
@inlinable
func deadline(after timeout: Duration) -> UInt64 {
  Libdispatch.time(0, timeout.saturatingNanoseconds)
}
