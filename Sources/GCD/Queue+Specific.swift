extension Queue {
  /// A typed key for values stored on queues with `setSpecific`.
  ///
  /// Each key object is its own identity: two keys never collide.
  public final class SpecificKey<Value: Sendable>: Sendable {
    /// Creates a new key, distinct from every other.
    public init() {}

    @usableFromInline
    var pointer: UnsafeRawPointer { UnsafeRawPointer(Unmanaged.passUnretained(self).toOpaque()) }
  }

  /// Stores `value` (or removes the value, for nil) on this queue under `key`.
  ///
  /// The queue keeps the value until it is replaced or the queue is
  /// destroyed. Do not replace a value while another thread may be reading
  /// it (libdispatch releases the old one at once).
  ///
  /// - Parameters:
  ///   - key: The key to store the value under.
  ///   - value: The value, or nil to remove it.
  ///
  /// The corresponding C function is `dispatch_queue_set_specific`.
  public func setSpecific<Value>(_ key: SpecificKey<Value>, _ value: Value?) {
    let boxed = value.map { Unmanaged.passRetained(SpecificBox($0)).toOpaque() }
    Libdispatch.queue_set_specific(raw, key.pointer, boxed) { box in
      if let box { Unmanaged<AnyObject>.fromOpaque(box).release() }
    }
  }

  /// The value stored on this queue under `key` (not on its targets).
  ///
  /// - Parameter key: The key the value was stored under.
  ///
  /// The corresponding C function is `dispatch_queue_get_specific`.
  public func getSpecific<Value>(_ key: SpecificKey<Value>) -> Value? {
    guard let box = Libdispatch.queue_get_specific(raw, key.pointer) else { return nil }
    return Unmanaged<SpecificBox<Value>>.fromOpaque(box).takeUnretainedValue().value
  }

  /// The value stored under `key` on the queue the current work item runs
  /// on, or on the first queue of its target chain that has one; nil
  /// outside any queue.
  ///
  /// - Parameter key: The key the value was stored under.
  ///
  /// The corresponding C function is `dispatch_get_specific`.
  public static func currentSpecific<Value>(_ key: SpecificKey<Value>) -> Value? {
    guard let box = Libdispatch.get_specific(key.pointer) else { return nil }
    return Unmanaged<SpecificBox<Value>>.fromOpaque(box).takeUnretainedValue().value
  }
}

final class SpecificBox<Value: Sendable>: Sendable {
  let value: Value
  init(_ value: Value) { self.value = value }
}
