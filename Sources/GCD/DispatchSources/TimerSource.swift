/// A timer: fires at a start time, then (optionally) every interval.
///
/// Ticks that come while the handler is busy or the source is suspended
/// are merged: `data` (and `fireCount`) says how many fires the event stands for.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_TIMER`.
public final class TimerSource: ValueSource, @unchecked Sendable {
  /// Creates a timer whose handlers run on `queue`. It does not fire until
  /// it is scheduled with `schedule(start:interval:leeway:)` and resumed.
  ///
  /// - Parameter queue: The queue the handlers run on.
  ///
  /// The corresponding C function is `dispatch_source_create`.
  public init(queue: Queue) {
    // A timer source with handle 0 and mask 0 is always accepted.
    super.init(created: try! Source.create(.timer, queue: queue), queue: queue)
  }

  /// How a timer fires.
  ///
  /// The corresponding C type is the mask of a timer source (`DISPATCH_TIMER_*`).
  public struct Flags: OptionSet, Sendable, Hashable, CustomStringConvertible {
    /// The `DISPATCH_TIMER_*` bits.
    public let rawValue: UInt

    /// Flags from their `DISPATCH_TIMER_*` bits.
    ///
    /// - Parameter rawValue: The bits.
    public init(rawValue: UInt) { self.rawValue = rawValue }

    /// Fire as close to the schedule as the system can, leeway or not,
    /// instead of letting the system coalesce fires to save power
    /// (`DISPATCH_TIMER_STRICT`).
    public static let strict = Flags(rawValue: 0x1)

    /// The set flags by name, e.g. `[strict]`.
    public var description: String { describeFlags(self, names: [(.strict, "strict")]) }
  }

  /// Creates a timer with `flags` whose handlers run on `queue`. It does not
  /// fire until it is scheduled with `schedule(start:interval:leeway:)` and
  /// resumed.
  ///
  /// - Parameters:
  ///   - queue: The queue the handlers run on.
  ///   - flags: `.strict` for a timer the system does not coalesce. Bits
  ///     beside `Flags`' stop the process with a message (libdispatch
  ///     rejects them).
  ///
  /// The corresponding C function is `dispatch_source_create` (the flags are its mask).
  public init(queue: Queue, flags: Flags) {
    requireKnownBits(flags, of: .strict, "TimerSource(flags: \(flags))", "libdispatch knows no such timer flag")
    super.init(created: try! Source.create(.timer, mask: flags.rawValue, queue: queue), queue: queue)
  }

  /// The flags the timer was created with (libdispatch's mask; it reads
  /// empty once the timer is cancelled).
  public var flags: Flags { Flags(rawValue: mask) }

  /// Sets when the timer first fires, how often it repeats, and how late it may fire.
  ///
  /// - Parameters:
  ///   - start: The first fire: `Deadline.now + …` counts on the monotonic
  ///     clock, `Deadline.wallClock() + …` on the wall clock.
  ///   - interval: The time between fires, or nil for a one-shot timer. It
  ///     must be at least 1 ns: a shorter, zero or negative interval stops
  ///     the process with a message (libdispatch would fire without pause).
  ///   - leeway: How late the system may fire to save power.
  ///
  /// Calling it again on a running timer replaces the schedule.
  ///
  /// The corresponding C function is `dispatch_source_set_timer`.
  public func schedule(start: Deadline, interval: Duration? = nil, leeway: Duration = .zero) {
    var nanos = Libdispatch.timeForever
    if let interval {
      let value = interval.saturatingNanoseconds
      if value <= 0 {
        fatalError(
          "GCD: TimerSource.schedule(interval: \(interval)): the interval must be at least 1 nanosecond;"
            + " use nil for a one-shot timer")
      }
      nanos = UInt64(value)
    }
    Libdispatch.source_set_timer(raw, start.rawValue, nanos, leeway.saturatingNonNegativeNanoseconds)
  }

  /// The number of fires merged into the event being handled (`data`).
  public var fireCount: UInt { data }
}
