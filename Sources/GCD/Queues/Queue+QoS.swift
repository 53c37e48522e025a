/// The priority bands and quality-of-service classes of queues, and the global queues they choose.
extension Queue {
  /// The priority bands of the global concurrent queues.
  public enum Priority: Sendable, Hashable, CaseIterable {
    /// `DISPATCH_QUEUE_PRIORITY_HIGH` (QoS user-initiated).
    case high
    /// `DISPATCH_QUEUE_PRIORITY_DEFAULT`.
    case `default`
    /// `DISPATCH_QUEUE_PRIORITY_LOW` (QoS utility).
    case low
    /// `DISPATCH_QUEUE_PRIORITY_BACKGROUND`.
    case background

    @usableFromInline
    var identifier: Int {
      switch self {
      case .high: 2
      case .default: 0
      case .low: -2
      case .background: Int(Int16.min)
      }
    }
  }

  /// A quality-of-service class for a created queue, with a relative
  /// priority (0 down to -15) inside the class.
  ///
  /// The corresponding C function is `dispatch_queue_attr_make_with_qos_class`.
  public struct QoS: Sendable, Hashable {
    /// The `qos_class_t` value.
    public private(set) var rawClass: UInt32
    /// The relative priority inside the class, from -15 to 0 (read-only: set
    /// it with `relative(_:)` or the initializer, which clamp it).
    public private(set) var relativePriority: Int32

    /// A class from its `qos_class_t` value.
    ///
    /// - Parameters:
    ///   - rawClass: The `qos_class_t` value (`QOS_CLASS_*`).
    ///   - relativePriority: The priority inside the class, clamped to -15...0
    ///     (`QOS_MIN_RELATIVE_PRIORITY`...0): libdispatch ignores a queue
    ///     attribute whose relative priority is outside that range, silently.
    public init(rawClass: UInt32, relativePriority: Int32 = 0) {
      self.rawClass = rawClass
      self.relativePriority = min(0, max(-15, relativePriority))
    }

    /// Work the user is waiting on to interact (`QOS_CLASS_USER_INTERACTIVE`).
    public static let userInteractive = QoS(rawClass: 0x21)
    /// Work the user started and waits for (`QOS_CLASS_USER_INITIATED`).
    public static let userInitiated = QoS(rawClass: 0x19)
    /// The default class (`QOS_CLASS_DEFAULT`).
    public static let `default` = QoS(rawClass: 0x15)
    /// Long-running work the user knows of (`QOS_CLASS_UTILITY`).
    public static let utility = QoS(rawClass: 0x11)
    /// Work the user does not see (`QOS_CLASS_BACKGROUND`).
    public static let background = QoS(rawClass: 0x09)
    /// No class: inherit the target's (`QOS_CLASS_UNSPECIFIED`).
    public static let unspecified = QoS(rawClass: 0)

    /// The same class with another relative priority (clamped to -15...0).
    ///
    /// - Parameter priority: The priority inside the class.
    public func relative(_ priority: Int32) -> QoS {
      QoS(rawClass: rawClass, relativePriority: min(0, max(-15, priority)))
    }
  }

  private static let globals: [Queue] = Priority.allCases.map {
    Queue(unownedGlobal: Libdispatch.get_global_queue($0.identifier), flags: globalFlag)
  }

  /// A global concurrent queue of the given priority.
  ///
  /// - Parameter priority: The priority band (`.default` unless given).
  /// The corresponding C function is `dispatch_get_global_queue`.
  public static func global(_ priority: Priority = .default) -> Queue {
    switch priority {
    case .high: globals[0]
    case .default: globals[1]
    case .low: globals[2]
    case .background: globals[3]
    }
  }

  /// The global concurrent queue of a quality-of-service class:
  /// `.userInteractive`, `.userInitiated`, `.default`, `.utility` or
  /// `.background` (`.unspecified` gives the default one). A global queue has
  /// no relative priority: the class alone chooses it. libdispatch on Linux
  /// has no user-interactive global queue: `.userInteractive` gives the
  /// user-initiated one (as `dispatch_get_global_queue` does). A `rawClass` that is
  /// no QoS class stops the process with a message (libdispatch would
  /// return no queue).
  ///
  /// - Parameter qos: The class.
  ///
  /// The corresponding C function is `dispatch_get_global_queue` (with a `qos_class_t`).
  public static func global(qos: QoS) -> Queue {
    switch qos.rawClass {
    case QoS.userInteractive.rawClass, QoS.userInitiated.rawClass: globals[0]
    case QoS.utility.rawClass: globals[2]
    case QoS.background.rawClass: globals[3]
    case QoS.default.rawClass, QoS.unspecified.rawClass: globals[1]
    default:
      fatalError("GCD: Queue.global(qos:): 0x\(String(qos.rawClass, radix: 16)) is not a QoS class (QOS_CLASS_*)")
    }
  }

  /// The quality-of-service class libdispatch assigned to the queue: the one
  /// it was created with, except that libdispatch on Linux records
  /// `.userInteractive` as `.userInitiated`.
  ///
  /// The corresponding C function is `dispatch_queue_get_qos_class`.
  public final var qos: QoS {
    let (qosClass, relative) = Libdispatch.queue_get_qos_class(raw)
    return QoS(rawClass: qosClass, relativePriority: relative)
  }
}
