// Submitting work items: the Queue side of WorkItem.

extension Queue {
  /// Submits `item` to run on the queue (it runs at most once, whatever
  /// else submitted it).
  ///
  /// - Parameter item: The item; its flags and QoS apply.
  ///
  /// The corresponding C function is `dispatch_async`.
  public func async(_ item: WorkItem) {
    item.submit(to: self, deadline: nil)
  }

  /// Submits `item` to run on the queue after `delay`.
  ///
  /// - Parameters:
  ///   - delay: How long from now.
  ///   - item: The item; cancel it to keep it from running.
  ///
  /// The corresponding C function is `dispatch_after`.
  public func after(_ delay: Duration, _ item: WorkItem) {
    after(deadline: .now + delay, item)
  }

  /// Submits `item` to run on the queue at `deadline` (monotonic or wall
  /// clock). With `Deadline.forever` it is not submitted.
  ///
  /// - Parameters:
  ///   - deadline: When to run it.
  ///   - item: The item; cancel it to keep it from running.
  ///
  /// The corresponding C function is `dispatch_after`.
  public func after(deadline: Deadline, _ item: WorkItem) {
    if deadline.isForever { return }
    item.submit(to: self, deadline: deadline.rawValue)
  }
}
