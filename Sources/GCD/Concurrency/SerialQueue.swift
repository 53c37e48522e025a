/// A serial queue that an actor can run on: a `Queue` (pass it wherever a
/// queue goes — sources, groups, `setTarget`) that is also a
/// `SerialExecutor` and a `TaskExecutor`.
///
/// ```swift
/// actor Cache {
///   let queue = SerialQueue(label: "cache")
///   nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }
/// }
/// ```
///
/// Each job the Swift runtime hands the queue is submitted with
/// `dispatch_async_f`, the job itself as the context (no allocation), and
/// runs isolated to this queue and with it as the task executor, inside
/// the package's frame for the queue: `isCurrent`, `Queue.precondition`
/// and `assumeIsolated` see actor code as running on the queue, and queue
/// work submitted by closure sees itself as isolated to the actor
/// (`checkIsolated()`). A task that prefers this queue
/// (`withTaskExecutorPreference(queue)`) calls an actor on it without a
/// thread hop.
///
/// Only a serial queue can be a serial executor: `Queue` itself is not one,
/// so a concurrent queue can never be made an actor's executor (the types
/// say so; no runtime check).
///
/// `Sendable`: like every `Queue`, thread-safe; the subclass adds no state.
///
/// The corresponding C type is a serial `dispatch_queue_t`.
public final class SerialQueue: Queue, SerialExecutor, @unchecked Sendable {
  /// Creates a serial queue for actors and tasks.
  ///
  /// - Parameters:
  ///   - label: A name shown in crash reports, messages and `label`.
  ///   - qos: The quality-of-service class of the queue's work.
  ///   - target: The queue this queue's work is funneled through (set with
  ///     `dispatch_set_target_queue`, so `setTarget(_:)` can change it).
  ///
  /// The corresponding C function is `dispatch_queue_create`.
  public init(label: String, qos: Queue.QoS = .unspecified, target: Queue? = nil) {
    var attr: OpaquePointer?
    if qos != .unspecified {
      attr = Libdispatch.queue_attr_make_with_qos_class(nil, qos.rawClass, qos.relativePriority)
    }
    super.init(
      created: label.withCString { Libdispatch.queue_create($0, attr) },
      flags: frameExclusive | Queue.serialExecutorFlag, state: .active)
    if let target {
      setTarget(target)
    }
  }

  /// Stops the process with a message naming the queue unless the current
  /// thread runs work of this queue (an executor job, a closure, a `sync`
  /// onto it, or work of a queue that targets it). The Swift runtime calls
  /// it from `assumeIsolated` and `#isolation` checks when the running job
  /// is not one of this executor's.
  public func checkIsolated() {
    if !isCurrent {
      fatalError(
        "GCD: SerialQueue '\(label)': expected to be isolated to this queue, but the current thread is not running its work"
      )
    }
  }

  /// Whether the current thread runs work of this queue (see `isCurrent`):
  /// the answer the Swift runtime asks for before `checkIsolated()`.
  public func isIsolatingCurrentContext() -> Bool? {
    isCurrent
  }
}
