/// A point in time for libdispatch: on the monotonic clock (`now`) or on the
/// wall clock (`wallClock()`), or `forever`.
///
/// Adding a `Duration` clamps instead of overflowing: a deadline that would
/// pass the end of the clock becomes `forever`, one before the start becomes
/// the earliest time.
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
  public static func wallClock() -> Deadline { Deadline(rawValue: Libdispatch.walltime(0)) }

  /// The wall-clock time `seconds` (and `nanoseconds`) after the Unix epoch.
  ///
  /// - Parameters:
  ///   - seconds: Whole seconds since 1970-01-01 00:00:00 UTC.
  ///   - nanoseconds: The nanoseconds past `seconds`.
  ///
  /// The corresponding C call is `dispatch_walltime(&timespec, 0)`.
  /// libdispatch returns `forever` for a time at or before the epoch; such a
  /// time has long passed, so it becomes the current wall-clock time
  /// instead (a deadline that is already due).
  public static func wallClock(secondsSinceEpoch seconds: Int, nanoseconds: Int = 0) -> Deadline {
    if seconds < 0 || (seconds == 0 && nanoseconds <= 1) { return wallClock() }
    return Deadline(rawValue: Libdispatch.walltime(seconds: seconds, nanoseconds: nanoseconds))
  }

  /// Whether `lhs` comes before `rhs`.
  ///
  /// Two deadlines on the same clock compare by time, and `forever` comes
  /// after every other deadline. A monotonic and a wall-clock deadline are
  /// not comparable in time (the clocks drift apart); they compare by clock
  /// (every monotonic deadline first), an order that is total and consistent
  /// but says nothing about which comes first.
  @inlinable
  public static func < (lhs: Deadline, rhs: Deadline) -> Bool { lhs.order < rhs.order }

  /// The deadline as (clock, time) in an order that sorts as deadlines do. libdispatch on Linux
  /// stores a monotonic deadline as the nanoseconds of uptime (below 2^63) and a wall-clock one
  /// negated (at or above 2^63, decreasing as time passes): `~rawValue` undoes the negation.
  @inlinable
  var order: (clock: UInt8, time: UInt64) {
    if isForever { return (2, 0) }
    if Int64(bitPattern: rawValue) < 0 { return (1, ~rawValue) }
    return (0, rawValue)
  }

  /// Whether this is `Deadline.forever`, the deadline that never passes.
  @inlinable
  public var isForever: Bool { rawValue == Libdispatch.timeForever }

  /// The deadline moved by `duration` (clamped). The corresponding C function is `dispatch_time`.
  @inlinable
  public static func + (lhs: Deadline, rhs: Duration) -> Deadline {
    Deadline(rawValue: Libdispatch.time(lhs.rawValue, rhs.saturatingNanoseconds))
  }

  /// The deadline moved back by `duration` (clamped).
  @inlinable
  public static func - (lhs: Deadline, rhs: Duration) -> Deadline {
    let nanos = rhs.saturatingNanoseconds
    return Deadline(rawValue: Libdispatch.time(lhs.rawValue, nanos == .min ? .max : -nanos))
  }

  /// Moves the deadline by `duration` (clamped).
  @inlinable
  public static func += (lhs: inout Deadline, rhs: Duration) { lhs = lhs + rhs }
}

extension Duration {
  /// This duration in whole nanoseconds, saturated at `Int64.min` and
  /// `Int64.max` (about 292 years: "practically never") instead of trapping.
  /// Every `Duration` the package hands to libdispatch goes through here.
  @inlinable
  var saturatingNanoseconds: Int64 {
    let (seconds, attoseconds) = components
    let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
    if overflow { return seconds < 0 ? .min : .max }
    let (sum, overflow2) = scaled.addingReportingOverflow(attoseconds / 1_000_000_000)
    if overflow2 { return seconds < 0 ? .min : .max }
    return sum
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
