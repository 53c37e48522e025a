import Synchronization

// Queue-specific values. libdispatch keys a value by an address and frees a
// replaced value on its own schedule, so the C value is never the user's
// value itself: it is a slot, one per queue and key, made once and kept
// until the queue dies. The slot holds its key (so no other key can be made
// at that address while a queue still files a value under it) and the
// value behind a mutex (so a reader copies the value out while a writer
// replaces it, and neither sees freed memory).

extension Queue {
  /// A typed key for values stored on queues with `setSpecific`.
  ///
  /// Each key object is its own identity: two keys never collide, and a key
  /// that is gone is never confused with a new one (a queue that holds a
  /// value under a key keeps the key alive).
  public final class SpecificKey<Value: Sendable>: Sendable {
    /// Creates a new key, distinct from every other.
    public init() {}

    @usableFromInline
    var pointer: UnsafeRawPointer { UnsafeRawPointer(Unmanaged.passUnretained(self).toOpaque()) }
  }

  /// Stores `value` (or removes the value, for nil) on this queue under `key`.
  ///
  /// The queue keeps the value until it is replaced or the queue is
  /// destroyed. Replacing or removing a value while other threads read it
  /// is safe: a reader gets the old value or the new one.
  ///
  /// - Parameters:
  ///   - key: The key to store the value under.
  ///   - value: The value, or nil to remove it.
  ///
  /// The corresponding C function is `dispatch_queue_set_specific`.
  public func setSpecific<Value>(_ key: SpecificKey<Value>, _ value: Value?) {
    if let slot = SpecificSlot<Value>.find(on: raw, key) {
      slot.replace(with: value)
    } else if let value {
      SpecificSlot<Value>.install(on: raw, key, value)
    }
  }

  /// The value stored on this queue under `key` (not on its targets).
  ///
  /// - Parameter key: The key the value was stored under.
  ///
  /// The corresponding C function is `dispatch_queue_get_specific`.
  public func getSpecific<Value>(_ key: SpecificKey<Value>) -> Value? {
    SpecificSlot<Value>.find(on: raw, key)?.value.withLock { $0 }
  }

  /// The value stored under `key` on the queue the current work item runs
  /// on, or on the first queue of its target chain that has one; nil
  /// outside any queue. A value removed with `setSpecific(key, nil)` hides
  /// nothing: the targets' values are found past it, as libdispatch finds
  /// them past a value set to `NULL`.
  ///
  /// - Parameter key: The key the value was stored under.
  ///
  /// The corresponding C function is `dispatch_get_specific`.
  public static func currentSpecific<Value>(_ key: SpecificKey<Value>) -> Value? {
    // The slot belongs to the queue the current work runs on or to one of its
    // targets, all alive while that work runs.
    guard let found = Libdispatch.get_specific(key.pointer) else { return nil }
    var slot = Unmanaged<SpecificSlot<Value>>.fromOpaque(found).takeUnretainedValue()
    while true {
      if let value = slot.value.withLock({ $0 }) { return value }
      // Removed (`setSpecific(key, nil)`): the slot stays, since a reader may hold it, so the walk
      // goes on where libdispatch's would after a removed value, along the targets this package
      // set (each queue keeps its targets alive, so every queue of the walk is valid).
      guard let next = SpecificSlot<Value>.nearest(key, from: targetLink(of: slot.queue).0) else { return nil }
      slot = next
    }
  }
}

/// The C value of one queue and one key: made once, never replaced, released
/// by libdispatch when the queue is destroyed.
final class SpecificSlot<Value: Sendable>: Sendable {
  /// Keeps the key's address from being reused while the slot exists.
  let key: Queue.SpecificKey<Value>
  let value: Mutex<Value?>
  /// The queue that holds the slot (not retained: the queue holds the slot).
  nonisolated(unsafe) let queue: OpaquePointer

  init(key: Queue.SpecificKey<Value>, value: Value, queue: OpaquePointer) {
    self.key = key
    self.value = Mutex(value)
    self.queue = queue
  }

  /// The slot of `key` on `queue` or on the first of its targets (as this package set them) that
  /// has one.
  static func nearest(_ key: Queue.SpecificKey<Value>, from queue: OpaquePointer?) -> SpecificSlot? {
    var next = queue
    while let queue = next {
      if let slot = find(on: queue, key) { return slot }
      next = targetLink(of: queue).0
    }
    return nil
  }

  /// The slot of `key` on `queue`, if one was installed. Valid as long as
  /// the caller holds the queue: slots are never replaced.
  static func find(on queue: OpaquePointer, _ key: Queue.SpecificKey<Value>) -> SpecificSlot? {
    guard let slot = Libdispatch.queue_get_specific(queue, key.pointer) else { return nil }
    return Unmanaged<SpecificSlot>.fromOpaque(slot).takeUnretainedValue()
  }

  /// Stores `value` and returns the value it replaces, so that the caller
  /// releases that one outside the lock.
  @discardableResult
  func replace(with value: Value?) -> Value? {
    self.value.withLock { stored in
      defer { stored = value }
      return stored
    }
  }

  /// Installs a slot holding `value`, or, when another thread installed one
  /// first, stores `value` in that one. The first store of a key on a queue
  /// is serialized by one lock, so a slot, once installed, is never replaced
  /// (a replaced slot could be freed under a reader that found it).
  @discardableResult
  static func install(on queue: OpaquePointer, _ key: Queue.SpecificKey<Value>, _ value: Value) -> Value? {
    specificSlotInstallation.withLock { _ in
      if let slot = find(on: queue, key) { return slot.replace(with: value) }
      let slot = Unmanaged.passRetained(SpecificSlot(key: key, value: value, queue: queue)).toOpaque()
      Libdispatch.queue_set_specific(queue, key.pointer, slot) { slot in
        if let slot { Unmanaged<AnyObject>.fromOpaque(slot).release() }
      }
      if Libdispatch.queue_get_specific(queue, key.pointer) != slot {
        // libdispatch did not keep it (a queue kind without specific values).
        Unmanaged<AnyObject>.fromOpaque(slot).release()
      }
      return nil
    }
  }
}

/// Serializes `SpecificSlot.install` (a generic type has no stored statics).
let specificSlotInstallation = Mutex<Void>(())
