import Synchronization

/// A group of work items whose completion you can wait for or be told of.
///
/// A `Group` owns one reference to its C group. Work submitted with
/// `async(on:)` keeps the group alive until it finishes, and `leave()` needs
/// the group, so whatever is still outstanding when the last reference goes
/// is an `enter()` that will never be matched: `deinit` balances it (the
/// group's `notify` work then runs) instead of letting libdispatch trap on
/// the release of a group in use.
///
/// `Sendable`: libdispatch groups are thread-safe; the wrapper holds the
/// immutable C pointer and, in debug builds, an atomic balance counter.
///
/// The corresponding C type is `dispatch_group_t`.
public final class Group: GCDObject, @unchecked Sendable {
  #if DEBUG
    /// Debug builds count enters and leaves so that an unbalanced `leave()`
    /// stops with a message instead of libdispatch's bare trap.
    @usableFromInline let balance = Atomic<Int>(0)
  #endif

  /// The tasks in `try await wait()` and their one notify, made by the
  /// first such wait that finds the group busy.
  let asyncWaiters = AtomicLazyReference<GroupWaiters>()

  /// Creates an empty group.
  ///
  /// The corresponding C function is `dispatch_group_create`.
  public init() {
    super.init(raw: Libdispatch.group_create())
  }

  deinit {
    // Every task submitted through this wrapper holds it, so what is left is
    // unmatched enter()s. dispatch_group_wait(NOW) reports whether any is.
    while Libdispatch.group_wait(raw, 0) != 0 {
      Libdispatch.group_leave(raw)
    }
    Libdispatch.release(raw)
  }

  /// Submits a closure to `queue` as part of the group.
  ///
  /// The corresponding C function is `dispatch_group_async` (here an enter,
  /// a `dispatch_async_f`, and a leave when the closure returns).
  @inlinable
  public func async(on queue: Queue, _ work: @escaping @Sendable () -> Void) {
    enter()
    if _slowPath(stallWatching) {
      let context = Work.watchedContext(work, queue: queue.raw, flags: queue.flags, group: self)
      return Libdispatch.async_f(queue.raw, context) { Work.runWatched($0) }
    }
    Libdispatch.async_f(queue.raw, Work.context(work, queue: queue.raw, flags: queue.flags, group: self)) {
      Work.run($0)
    }
  }

  /// Submits a C function and its context to `queue` as part of the group.
  ///
  /// The corresponding C function is `dispatch_group_async_f` (here an
  /// enter, a `dispatch_async_f`, and a leave when the function returns, so
  /// that the pending work keeps the group alive).
  @inlinable
  public func async(
    on queue: Queue, context: UnsafeMutableRawPointer?,
    function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    enter()
    let work = GroupFunctionWork(group: self, context: context, function: function, queue: queue)
    Libdispatch.async_f(queue.raw, Unmanaged.passRetained(work).toOpaque()) { GroupFunctionWork.run($0) }
  }

  /// Counts a piece of work in the group explicitly; pair it with `leave()`.
  ///
  /// The corresponding C function is `dispatch_group_enter`.
  @inlinable
  public func enter() {
    #if DEBUG
      balance.add(1, ordering: .relaxed)
    #endif
    Libdispatch.group_enter(raw)
  }

  /// Marks a piece of work counted with `enter()` as done.
  ///
  /// A `leave()` without an `enter()` is a bug: debug builds stop with a
  /// message; release builds leave the check to libdispatch, which traps.
  ///
  /// The corresponding C function is `dispatch_group_leave`.
  @inlinable
  public func leave() {
    #if DEBUG
      if balance.subtract(1, ordering: .relaxed).newValue < 0 {
        fatalError("GCD: Group.leave() without a matching enter()")
      }
    #endif
    Libdispatch.group_leave(raw)
  }

  /// Waits until every work item of the group has finished.
  ///
  /// The corresponding C function is `dispatch_group_wait` with `DISPATCH_TIME_FOREVER`.
  @available(*, noasync, message: "blocks the thread; use `try await wait()` from async code")
  @inlinable
  public func wait() {
    _ = Libdispatch.group_wait(raw, Libdispatch.timeForever)
  }

  /// Waits until every work item has finished or `timeout` has passed.
  ///
  /// - Returns: true if all work finished, false on timeout.
  ///
  /// The corresponding C function is `dispatch_group_wait`.
  @available(*, noasync, message: "blocks the thread; use `try await wait()` from async code")
  @inlinable
  public func wait(timeout: Duration) -> Bool {
    Libdispatch.group_wait(raw, deadline(after: timeout)) == 0
  }

  /// Waits until every work item has finished or the deadline has come.
  ///
  /// - Returns: true if all work finished, false on timeout.
  @available(*, noasync, message: "blocks the thread; use `try await wait()` from async code")
  @inlinable
  public func wait(deadline: Deadline) -> Bool {
    Libdispatch.group_wait(raw, deadline.rawValue) == 0
  }

  /// Suspends the task until every work item of the group has finished;
  /// no thread waits (a `dispatch_group_notify_f` resumes the task).
  ///
  /// - Throws: `CancellationError` when the task is cancelled first; it
  ///   returns at once then, and leaves nothing behind: the tasks waiting on
  ///   one group share one notification, which stays with the group until it
  ///   empties, however many of them were cancelled.
  ///
  /// The corresponding C function is `dispatch_group_notify_f`.
  public func wait() async throws(CancellationError) {
    if Libdispatch.group_wait(raw, 0) == 0 { return }
    let waiters = asyncWaiters.load() ?? asyncWaiters.storeIfNil(GroupWaiters(group: raw))
    let waiter = AsyncWaiter()
    let done = await withTaskCancellationHandler {
      await waiters.wait(waiter)
    } onCancel: {
      waiters.cancel(waiter)
    }
    if !done { throw CancellationError() }
  }

  /// Submits `work` to `queue` once every work item of the group has
  /// finished (at once if the group is empty).
  ///
  /// The corresponding C function is `dispatch_group_notify`.
  @inlinable
  public func notify(on queue: Queue, _ work: @escaping @Sendable () -> Void) {
    if _slowPath(stallWatching) {
      let context = Work.watchedContext(work, queue: queue.raw, flags: queue.flags)
      return Libdispatch.group_notify_f(raw, queue.raw, context) { Work.runWatched($0) }
    }
    Libdispatch.group_notify_f(raw, queue.raw, Work.context(work, queue: queue.raw, flags: queue.flags)) {
      Work.run($0)
    }
  }

  /// Submits a C function and its context to `queue` once the group is
  /// done; it runs inside the package's frame for the queue.
  ///
  /// The corresponding C function is `dispatch_group_notify_f`.
  @inlinable
  public func notify(
    on queue: Queue, context: UnsafeMutableRawPointer?,
    function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    Libdispatch.groupNotifyInFrame(raw, queue.raw, queue.flags, context, function)
  }
}

extension Group {
  /// The tasks in `try await wait()` and the notifies of theirs pending on
  /// the C group (at most one): a test's bound.
  var asyncWaitRecords: (waiting: Int, notifies: Int) { asyncWaiters.load()?.records ?? (0, 0) }
}
