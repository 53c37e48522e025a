import Synchronization

// MARK: - Suspension, activation, targets

extension Queue {
  /// Suspends the queue: work already running finishes, queued work waits
  /// until a matching `resume()`. Calls nest; the queue runs again when
  /// every `suspend()` has its `resume()`. Outstanding suspensions are
  /// balanced when the queue is dropped.
  ///
  /// Global queues and the main queue cannot be suspended (libdispatch
  /// ignores it); this stops with a message for them.
  ///
  /// The corresponding C function is `dispatch_suspend`.
  public func suspend() {
    if isGlobal { fatalError("GCD: Queue '\(label)' is a global queue; it cannot be suspended") }
    Libdispatch.suspend(raw)
    state.update { $0.suspend() }.perform(on: raw)
  }

  /// Resumes a queue suspended with `suspend()`.
  ///
  /// A `resume()` without a matching `suspend()` stops the process with a
  /// message naming the queue (libdispatch would trap with no message).
  ///
  /// The corresponding C function is `dispatch_resume`.
  public func resume() {
    if isGlobal { fatalError("GCD: Queue '\(label)' is a global queue; it cannot be resumed") }
    if state.update({ $0.resume(starts: false) }).perform(on: raw) != nil {
      fatalError("GCD: Queue '\(label)': resume() without a matching suspend()")
    }
  }

  /// How many `suspend()` calls have no `resume()` yet.
  public var suspensionCount: Int { Int(state.load(ordering: .relaxed).suspensions) }

  /// Activates a queue created with `initiallyInactive: true`; its queued
  /// work starts. Calling it again, or on an active queue, does nothing.
  ///
  /// The corresponding C function is `dispatch_activate`.
  public func activate() {
    state.update { $0.activate() }.perform(on: raw)
  }

  /// Whether the queue is active (not created inactive, or activated since).
  public var isActive: Bool { state.load(ordering: .acquiring).isActive }

  /// Funnels this queue's work through `target`: work items of both still
  /// run one at a time if `target` is serial, and at `target`'s priority.
  ///
  /// Work already handed to the old target stays there. A queue created
  /// with `initiallyInactive: true` can be re-targeted only before
  /// `activate()` (libdispatch fixes its target then). A queue cannot
  /// target itself or a queue that (through its targets) targets it, and
  /// global queues cannot be re-targeted; each stops with a message.
  ///
  /// - Parameter target: The queue to run this queue's work through.
  ///
  /// The corresponding C function is `dispatch_set_target_queue`.
  public func setTarget(_ target: Queue) {
    if isGlobal { fatalError("GCD: Queue '\(label)' is a global queue; its target cannot be changed") }
    if flags & Queue.createdInactiveFlag != 0 && isActive {
      fatalError(
        "GCD: Queue '\(label)' was created inactive and has been activated; libdispatch fixes its target at activation")
    }
    Queue.settingTargets.withLock { _ in
      var next: OpaquePointer? = target.raw
      while let queue = next {
        if queue == raw {
          fatalError("GCD: Queue '\(label)': setTarget('\(target.label)') would make a cycle of targets")
        }
        next = targetLink(of: queue).0
      }
      // The new link takes over the list's reference to the older ones.
      let previous = Libdispatch.queue_get_specific(raw, Libdispatch.targetsKey).map {
        Unmanaged<TargetLink>.fromOpaque($0).takeRetainedValue()
      }
      let link = Unmanaged.passRetained(TargetLink(target: target, previous: previous))
      Libdispatch.queue_set_specific(raw, Libdispatch.targetsKey, link.toOpaque(), nil)
      let tagged = UInt(bitPattern: UnsafeMutableRawPointer(target.raw)) | (target.flags & frameExclusive)
      Libdispatch.queue_set_specific(raw, Libdispatch.targetKey, UnsafeMutableRawPointer(bitPattern: tagged), nil)
      _ = state.update { $0.retarget() }
      Libdispatch.set_target_queue(raw, target.raw)
    }
  }

  /// Serializes `setTarget` (rare): the cycle check sees every target set
  /// before it, and each new link holds the one it replaces.
  static let settingTargets = Mutex(())
}

/// One entry of a queue's list of the targets set on it: the target's
/// wrapper (so its C queue stays valid for chain walks) and the entry it
/// replaced.
final class TargetLink: @unchecked Sendable {
  let target: Queue
  let previous: TargetLink?

  init(target: Queue, previous: TargetLink?) {
    self.target = target
    self.previous = previous
  }
}

/// The target this package recorded on `queue`, and whether it is serial.
func targetLink(of queue: OpaquePointer) -> (OpaquePointer?, Bool) {
  guard let value = Libdispatch.queue_get_specific(queue, Libdispatch.targetKey) else {
    return (nil, false)
  }
  let bits = UInt(bitPattern: value)
  return (OpaquePointer(bitPattern: bits & ~1), bits & 1 != 0)
}
