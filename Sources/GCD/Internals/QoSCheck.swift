/// The one check of a `Queue.QoS` before it reaches libdispatch, shared by
/// `Queue(label:qos:)` and `WorkItem(qos:)`.
///
/// libdispatch answers a class it does not know, or a relative priority
/// outside `QOS_MIN_RELATIVE_PRIORITY...0` (-15...0), by dropping the QoS
/// without a word (`dispatch_queue_attr_make_with_qos_class` returns the
/// attribute unchanged) or by making no block at all. Only
/// `QoS(rawClass:relativePriority:)` with numbers of one's own makes such a
/// value (`relative(_:)` clamps), so it is a programmer error and stops
/// with a message (docs/architecture.md, "Errors and misuse").
extension Queue.QoS {
  /// Stops the process unless libdispatch knows this class and relative
  /// priority; `call` opens the message, e.g. `WorkItem(`.
  @usableFromInline
  func checkKnown(_ call: @autoclosure () -> String) {
    if !Queue.QoS.knownClasses.contains(rawClass) || !(-15...0).contains(relativePriority) {
      fatalError(
        "GCD: \(call())qos: class 0x\(String(rawClass, radix: 16)), relative \(relativePriority)):"
          + " not a QoS class libdispatch knows, or a relative priority outside -15...0")
    }
  }

  static let knownClasses: [UInt32] = [
    Queue.QoS.unspecified.rawClass, Queue.QoS.background.rawClass, Queue.QoS.utility.rawClass,
    Queue.QoS.default.rawClass, Queue.QoS.userInitiated.rawClass, Queue.QoS.userInteractive.rawClass,
  ]
}
