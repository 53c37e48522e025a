import Synchronization

/// The life cycle of a queue or a source, as one machine word: the state
/// machine that keeps `activate`, `suspend`, `resume` and `cancel` balanced
/// so that libdispatch never sees an over-resume or the release of an
/// inactive or suspended object.
///
/// States: inactive (created inactive, not started yet), active,
/// suspended(n) (`n` suspensions without their resume, active or not) and
/// cancelled (sources only). Each event is a `mutating` function that moves
/// the state and returns the C work to do (`Action`); the wrappers keep the
/// word in an `Atomic<Lifecycle>` and apply events with `update`, a
/// compare-and-swap loop, so the machine needs no lock.
///
/// Cancel is final: it balances the outstanding suspensions at once, so
/// the cancel handler runs promptly, and it activates a source that was
/// never started. After it the word still counts the user's `suspend()`
/// and `resume()` calls, so that a `resume()` matching an earlier
/// `suspend()` is not mistaken for an unbalanced one, but no C call
/// follows: the C object is already balanced.
///
/// A source's event sequence holds it back while no one takes the element it has taken from it
/// (`hold`, `release`): a suspension of the package's own, beside the user's count and never
/// mistaken for one of them, so a user's `resume()` cannot end it and `cancel()` or the drop
/// balances it with the user's.
///
/// Layout: bit 0 active (for a cancelled source: started by the user),
/// bit 1 cancelled, bit 2 `retargeted` (not life cycle: `Queue` records
/// there that the package set a target, so that `sync`'s fast path reads
/// one word), bit 3 held (sources: the event sequence's suspension), the
/// user's suspension count from bit 4 up.
@frozen
@usableFromInline
struct Lifecycle: RawRepresentable, AtomicRepresentable, Hashable, Sendable, CustomStringConvertible {
  @usableFromInline var rawValue: UInt

  @usableFromInline static let activeBit: UInt = 1
  @usableFromInline static let cancelledBit: UInt = 2
  @usableFromInline static let retargetedBit: UInt = 4
  @usableFromInline static let heldBit: UInt = 8
  @usableFromInline static let suspensionUnit: UInt = 16

  @inlinable init(rawValue: UInt) { self.rawValue = rawValue }

  /// A source, or a queue created inactive: nothing runs until it is activated.
  @usableFromInline static let inactive = Lifecycle(rawValue: 0)
  /// A queue created active.
  @usableFromInline static let active = Lifecycle(rawValue: activeBit)

  /// The C work an event asks for.
  @usableFromInline
  enum Action: Hashable, Sendable {
    /// Nothing to do.
    case none
    /// `dispatch_activate`: the first start (a source runs its start hook first).
    case activate
    /// `dispatch_resume`, once.
    case resume
    /// Cancel or drop: `dispatch_resume` `resumes` times, then
    /// `dispatch_activate` if `activate`, so libdispatch sees a balanced,
    /// started object.
    case settle(resumes: UInt, activate: Bool)
    /// The call has nothing to balance: stop with a message naming the object.
    case unbalanced(Misuse)
  }

  /// Why a `resume()` is unbalanced.
  @usableFromInline
  enum Misuse: Hashable, Sendable {
    /// The object runs and is not suspended.
    case notSuspended
    /// The source was started and then cancelled.
    case cancelled
    /// The source runs under its event sequence, which holds it back; the user has no suspension
    /// to balance.
    case held
  }

  @inlinable var isActive: Bool { rawValue & Lifecycle.activeBit != 0 }
  @inlinable var isCancelled: Bool { rawValue & Lifecycle.cancelledBit != 0 }
  /// The `suspend()` calls without their `resume()`.
  @inlinable var suspensions: UInt { rawValue / Lifecycle.suspensionUnit }
  /// A source held back by its event sequence (`hold`).
  @inlinable var isHeld: Bool { rawValue & Lifecycle.heldBit != 0 }
  /// Held back, by the user's suspensions or by the event sequence (a cancelled source never is).
  @inlinable var isSuspended: Bool { !isCancelled && (suspensions > 0 || isHeld) }
  /// The C suspensions the word accounts for: the user's and the sequence's hold.
  @inlinable var suspensionsInC: UInt { suspensions + (isHeld ? 1 : 0) }
  /// `Queue`: the package set a target on the queue.
  @inlinable var isRetargeted: Bool { rawValue & Lifecycle.retargetedBit != 0 }

  @usableFromInline var description: String {
    var parts = [isCancelled ? "cancelled" : isActive ? "active" : "inactive"]
    if isCancelled && isActive { parts.append("started") }
    if suspensions > 0 { parts.append("suspended(\(suspensions))") }
    if isHeld { parts.append("held") }
    if isRetargeted { parts.append("retargeted") }
    return parts.joined(separator: ", ")
  }

  // MARK: Events

  /// `activate()`: starts an inactive object; nothing otherwise.
  @inlinable mutating func activate() -> Action {
    if isActive || isCancelled { return .none }
    rawValue |= Lifecycle.activeBit
    return .activate
  }

  /// The start an event sequence claims (`SourceEvents`): a source that was
  /// never started, suspended or cancelled becomes active in the word at
  /// once, and the caller activates the C object after installing its
  /// handlers; anything else is not started here (`.none`). One
  /// compare-and-swap decides between two sequences, or a sequence and a
  /// `resume()`: the loser sees an active source.
  @inlinable mutating func claimStart() -> Action {
    if isActive || isCancelled || suspensions > 0 { return .none }
    rawValue |= Lifecycle.activeBit
    return .activate
  }

  /// `suspend()`, after the caller has already called `dispatch_suspend`
  /// (so a concurrent cancel never resumes a suspension that C has not
  /// seen yet). On a cancelled source the suspension is only counted, and
  /// the action undoes the C call.
  @inlinable mutating func suspend() -> Action {
    rawValue += Lifecycle.suspensionUnit
    return isCancelled ? .resume : .none
  }

  /// `resume()`: balances a suspension; with `starts` (sources) it starts
  /// an inactive object that has none.
  @inlinable mutating func resume(starts: Bool) -> Action {
    if suspensions > 0 {
      rawValue -= Lifecycle.suspensionUnit
      return isCancelled ? .none : .resume
    }
    if starts && !isActive {
      rawValue |= Lifecycle.activeBit
      // A cancelled source is already started by its cancel: the start it asks for is moot.
      return isCancelled ? .none : .activate
    }
    return .unbalanced(isCancelled ? .cancelled : isHeld ? .held : .notSuspended)
  }

  /// The event sequence holds the source back (it took an element no one asked for yet), after
  /// the caller has called `dispatch_suspend`, as `suspend()` does. One hold at a time; on a
  /// cancelled source the action undoes the C call.
  @inlinable mutating func hold() -> Action {
    rawValue |= Lifecycle.heldBit
    return isCancelled ? .resume : .none
  }

  /// The event sequence's consumer took the held element: the hold ends (`dispatch_resume`),
  /// unless a cancel or the drop has balanced it already.
  @inlinable mutating func release() -> Action {
    if !isHeld { return .none }
    if isCancelled { return .none }
    rawValue &= ~Lifecycle.heldBit
    return .resume
  }

  /// `cancel()` (sources): final; balances the suspensions and starts a
  /// source that was never started, so its cancel handler runs now.
  @inlinable mutating func cancel() -> Action {
    if isCancelled { return .none }
    rawValue |= Lifecycle.cancelledBit
    return .settle(resumes: suspensionsInC, activate: !isActive)
  }

  /// `Queue.setTarget`: records that the package set a target (not a life-cycle change).
  @inlinable mutating func retarget() -> Action {
    rawValue |= Lifecycle.retargetedBit
    return .none
  }

  /// The last reference goes: whatever makes the release safe (for a
  /// source the wrapper cancels it first).
  @inlinable mutating func drop() -> Action {
    if isCancelled { return .none }
    let action = Action.settle(resumes: suspensionsInC, activate: !isActive)
    rawValue = Lifecycle.activeBit | Lifecycle.cancelledBit
    return action
  }
}

extension Lifecycle.Action {
  /// Does the C side of the action on `object`, and returns the misuse of
  /// an `.unbalanced` action (the caller stops with a message naming the
  /// object). No closure: a capturing one would cost a retain per call.
  @inlinable
  @inline(__always)
  @discardableResult
  func perform(on object: OpaquePointer) -> Lifecycle.Misuse? {
    switch self {
    case .none: break
    case .activate: Libdispatch.activate(object)
    case .resume: Libdispatch.resume(object)
    case .settle(let resumes, let activate):
      for _ in 0..<resumes { Libdispatch.resume(object) }
      if activate { Libdispatch.activate(object) }
    case .unbalanced(let why): return why
    }
    return nil
  }
}

extension Atomic where Value == Lifecycle {
  /// Applies `event` atomically (a compare-and-swap loop) and returns its action.
  @inlinable
  @inline(__always)
  func update(_ event: (inout Lifecycle) -> Lifecycle.Action) -> Lifecycle.Action {
    var current = load(ordering: .relaxed)
    while true {
      var next = current
      let action = event(&next)
      if next == current { return action }
      let (exchanged, original) = compareExchange(
        expected: current, desired: next, ordering: .acquiringAndReleasing)
      if exchanged { return action }
      current = original
    }
  }
}
