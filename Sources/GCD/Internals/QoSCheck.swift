/// The one check of a `Queue.QoS` before it reaches libdispatch, shared by
/// `Queue(label:qos:)` and `WorkItem(qos:)`.
///
/// libdispatch answers a class it does not know by dropping the QoS without
/// a word (`dispatch_queue_attr_make_with_qos_class` returns the attribute
/// unchanged) or by making no block at all. Only `QoS(rawClass:)` with a
/// number of one's own makes such a value (the relative priority is clamped
/// by `QoS` itself), so it is a programmer error and stops with a message
/// (docs/architecture.md, "Errors and misuse").
extension Queue.QoS {
  /// Stops the process unless libdispatch knows this class; `call` opens
  /// the message, e.g. `WorkItem(`.
  @usableFromInline
  func checkKnown(_ call: @autoclosure () -> String) {
    if !Queue.QoS.knownClasses.contains(rawClass) {
      fatalError(
        "GCD: \(call())qos: class 0x\(String(rawClass, radix: 16)), relative \(relativePriority)):"
          + " not a QoS class libdispatch knows")
    }
  }

  static let knownClasses: [UInt32] = [
    Queue.QoS.unspecified.rawClass, Queue.QoS.background.rawClass, Queue.QoS.utility.rawClass,
    Queue.QoS.default.rawClass, Queue.QoS.userInitiated.rawClass, Queue.QoS.userInteractive.rawClass,
  ]
}
