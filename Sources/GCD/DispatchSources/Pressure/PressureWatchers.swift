import Synchronization

/// The Linux half of a `PressureSource`: one trigger, each fire merged as 1
/// into the user's DATA_ADD source.
///
/// Merges happen under the lock and only while running, and `stop()` ends
/// running under the same lock before it releases the target: a fire that
/// races the cancel either merges into a live target or not at all.
final class PressureCounter: KernelWatcher {
  let trigger: PressureTrigger
  let target: MergeTarget
  private let phase = Mutex(WatcherPhase<Void>.idle)

  /// Takes over `trigger` and a reference to `target`.
  init(trigger: PressureTrigger, target: OpaquePointer) {
    self.trigger = trigger
    self.target = MergeTarget(retaining: target)
  }

  func start() {
    let starts = phase.withLock { phase in
      guard case .idle = phase else { return false }
      phase = .running(())
      return true
    }
    guard starts else { return }
    trigger.start { [self] in
      phase.withLock { phase in
        if case .running = phase { target.merge(1) }
      }
    }
  }

  func stop() {
    let stops = phase.withLock { phase in
      if case .stopped = phase { return false }
      phase = .stopped
      return true
    }
    guard stops else { return }
    trigger.stop()
    target.release()
  }
}

/// The Linux half of a `MemoryPressureSource`: two triggers on the memory
/// pressure file (warning: `some` stall, critical: `full` stall, each a
/// threshold within `MemoryPressureSource.window`), the current level, and
/// while the level is above normal a timer that, once a window, reads the
/// file's cumulative totals and lowers the level when the last window's
/// stall stayed below its threshold.
///
/// Levels rise only by a trigger (the kernel's measure, delivered at once);
/// they fall only by the timer: `.critical` to `.warning` after a window
/// whose `full` stall stayed below the critical threshold with no critical
/// fire, to `.normal` after a window whose `some` stall stayed below the
/// warning threshold with no fire at all. Each change of level replaces the
/// user's DATA_REPLACE source's value with that level when the user watches
/// it; a fire at the current level changes nothing.
///
/// All transitions run on `PressureTrigger.queue` (the triggers' readers
/// and the timer share it) under the lock; merges happen under the lock and
/// only while running, as in `PressureCounter`.
final class MemoryPressureWatcher: KernelWatcher {
  /// A level, ordered.
  enum Level: Int, Comparable {
    case normal, warning, critical

    static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }

    var event: MemoryPressureEvents {
      switch self {
      case .normal: .normal
      case .warning: .warning
      case .critical: .critical
      }
    }
  }

  /// The timer, held in `Sendable` state (libdispatch objects are thread-safe).
  struct Timer: @unchecked Sendable {
    let source: OpaquePointer
  }

  struct Running {
    var level = Level.normal
    /// The highest level a trigger reported since the last check.
    var firedSinceCheck: Level?
    /// The totals (µs) at the last check, or when the level last rose.
    var lastTotals: (some: UInt64, full: UInt64) = (0, 0)
    var timer: Timer?
  }

  let warning: PressureTrigger
  let critical: PressureTrigger
  let path: String
  let events: MemoryPressureEvents
  let target: MergeTarget
  /// The thresholds and window, in microseconds.
  let warningThreshold: UInt64
  let criticalThreshold: UInt64
  let window: Duration
  private let phase = Mutex(WatcherPhase<Running>.idle)

  /// Makes the warning and the critical trigger on `path` (the first is
  /// closed again when the second fails).
  static func triggers(path: String, operation: String) throws(GCDError) -> (PressureTrigger, PressureTrigger) {
    let window = MemoryPressureSource.window
    let (warningMicroseconds, windowMicroseconds) = try PressureFile.check(
      threshold: MemoryPressureSource.warningThreshold, window: window, operation: operation)
    let (criticalMicroseconds, _) = try PressureFile.check(
      threshold: MemoryPressureSource.criticalThreshold, window: window, operation: operation)
    let warning = try PressureTrigger(
      path: path, stall: "some", threshold: warningMicroseconds, window: windowMicroseconds,
      operation: operation + " (warning)")
    do {
      let critical = try PressureTrigger(
        path: path, stall: "full", threshold: criticalMicroseconds, window: windowMicroseconds,
        operation: operation + " (critical)")
      return (warning, critical)
    } catch {
      warning.stop()
      throw error
    }
  }

  /// Takes over both triggers (from `triggers(path:operation:)`) and a reference to `target`.
  init(triggers: (PressureTrigger, PressureTrigger), path: String, events: MemoryPressureEvents, target: OpaquePointer)
  {
    (warning, critical) = triggers
    self.path = path
    self.events = events
    window = MemoryPressureSource.window
    warningThreshold = UInt64(PressureFile.microseconds(MemoryPressureSource.warningThreshold))
    criticalThreshold = UInt64(PressureFile.microseconds(MemoryPressureSource.criticalThreshold))
    self.target = MergeTarget(retaining: target)
  }

  func start() {
    let starts = phase.withLock { phase in
      guard case .idle = phase else { return false }
      phase = .running(Running())
      return true
    }
    guard starts else { return }
    warning.start { [self] in fired(.warning) }
    critical.start { [self] in fired(.critical) }
  }

  func stop() {
    let timer = phase.withLock { phase -> Timer?? in
      guard case .running(let running) = phase else {
        if case .stopped = phase { return nil }
        phase = .stopped
        return .some(nil)
      }
      phase = .stopped
      return .some(running.timer)
    }
    guard let timer else { return }
    if let timer { Libdispatch.source_cancel(timer.source) }
    warning.stop()
    critical.stop()
    target.release()
  }

  /// A trigger fired (on the triggers' queue).
  private func fired(_ level: Level) {
    let totals = PressureFile.totals(at: path)
    let newTimer = phase.withLock { phase -> Timer? in
      guard case .running(var running) = phase else { return nil }
      running.firedSinceCheck = max(running.firedSinceCheck ?? level, level)
      var made: Timer?
      if level > running.level {
        running.level = level
        if let totals { running.lastTotals = totals }
        if running.timer == nil {
          made = makeTimer()
          running.timer = made
        }
        deliver(level)
      }
      phase = .running(running)
      return made
    }
    if let newTimer { Libdispatch.activate(newTimer.source) }
  }

  /// Once a window while above normal (on the triggers' queue): lowers the
  /// level when the last window was quiet enough.
  private func check() {
    let totals = PressureFile.totals(at: path)
    let finishedTimer = phase.withLock { phase -> Timer? in
      guard case .running(var running) = phase, let totals else { return nil }
      defer { phase = .running(running) }
      let some = totals.some &- running.lastTotals.some
      let full = totals.full &- running.lastTotals.full
      let fired = running.firedSinceCheck
      running.lastTotals = totals
      running.firedSinceCheck = nil
      let measured: Level =
        full >= criticalThreshold || fired == .critical
        ? .critical : some >= warningThreshold || fired != nil ? .warning : .normal
      guard measured < running.level else { return nil }
      running.level = measured
      deliver(measured)
      guard measured == .normal, let timer = running.timer else { return nil }
      running.timer = nil
      return timer
    }
    if let finishedTimer { Libdispatch.source_cancel(finishedTimer.source) }
  }

  /// Replaces the user source's value with `level` if the user watches it (under the lock).
  private func deliver(_ level: Level) {
    if events.contains(level.event) { target.merge(level.event.rawValue) }
  }

  /// A repeating timer on the triggers' queue, every window from now (not
  /// yet started); it releases itself when cancelled.
  private func makeTimer() -> Timer? {
    guard let source = Libdispatch.source_create(.timer, 0, 0, PressureTrigger.queue.raw) else { return nil }
    let nanoseconds = UInt64(window.saturatingNanoseconds)
    Libdispatch.source_set_timer(
      source, Libdispatch.time(0, window.saturatingNanoseconds), nanoseconds, nanoseconds / 20)
    Libdispatch.source_set_event_handler(source) { [weak self] in self?.check() }
    Libdispatch.source_set_cancel_handler(source) { Libdispatch.release(source) }
    return Timer(source: source)
  }
}
