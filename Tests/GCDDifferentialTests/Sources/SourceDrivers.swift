// The two implementations a source sequence runs through, behind one small interface: the
// runner (SourceRun) never knows which one it drives, so both runs make the same calls in the
// same order.
import Dispatch
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The kinds of source a sequence creates.
enum SourceKind: String, CaseIterable, Sendable {
  case read, write, timer, add, or, signal1, signal2

  var isDescriptor: Bool { self == .read || self == .write }
  var isData: Bool { self == .add || self == .or }
  var isSignal: Bool { self == .signal1 || self == .signal2 }
  var signalNumber: Int32 { self == .signal1 ? SIGUSR1 : SIGUSR2 }
}

/// A created source, opaque to the runner.
protocol SourceHandle: AnyObject, Sendable {}

/// What the runner asks of an implementation.
protocol SourceDriver: Sendable {
  var side: Side { get }
  /// A serial queue whose handlers `isCurrent(queue:)` recognises by `index`.
  func makeQueue(index: Int) -> AnyObject
  func sync(_ queue: AnyObject)
  /// The index of the queue running the caller, or nil.
  func currentQueue() -> Int?
  /// A source, or the errno its creation failed with.
  func create(_ kind: SourceKind, descriptor: Int32, queue: AnyObject) -> Result<SourceHandle, GCDErrorCode>
  func setEventHandler(_ source: SourceHandle, _ handler: @escaping @Sendable (UInt) -> Void)
  func clearEventHandler(_ source: SourceHandle)
  func setCancelHandler(_ source: SourceHandle, _ handler: @escaping @Sendable () -> Void)
  func setRegistrationHandler(_ source: SourceHandle, _ handler: @escaping @Sendable () -> Void)
  func resume(_ source: SourceHandle)
  func suspend(_ source: SourceHandle)
  func cancel(_ source: SourceHandle)
  func merge(_ source: SourceHandle, _ value: UInt)
  /// A one-shot timer `delay` from now.
  func schedule(_ source: SourceHandle, after delay: Duration)
  /// Whether dropping the last reference needs the runner to cancel and balance first (the
  /// oracle traps otherwise: `IntendedDifference.safeDrop`).
  var dropNeedsBalancing: Bool { get }
}

/// An errno from a throwing creation.
struct GCDErrorCode: Error, Equatable { let errno: Int32 }

// MARK: - import Dispatch

final class DispatchSourceHandle: SourceHandle, @unchecked Sendable {  // DispatchSource is thread-safe
  let source: DispatchSourceProtocol
  init(_ source: DispatchSourceProtocol) { self.source = source }
}

struct DispatchSourceDriver: SourceDriver {
  var side: Side { .dispatch }
  var dropNeedsBalancing: Bool { true }

  func makeQueue(index: Int) -> AnyObject {
    indexedDispatchQueue(label: "differential.dispatch.\(index)", index: index)
  }

  func sync(_ queue: AnyObject) { (queue as! DispatchQueue).sync {} }

  func currentQueue() -> Int? { currentDispatchQueueIndex() }

  func create(_ kind: SourceKind, descriptor: Int32, queue: AnyObject) -> Result<SourceHandle, GCDErrorCode> {
    let queue = queue as! DispatchQueue
    let source: DispatchSourceProtocol =
      switch kind {
      case .read: DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
      case .write: DispatchSource.makeWriteSource(fileDescriptor: descriptor, queue: queue)
      case .timer: DispatchSource.makeTimerSource(queue: queue)
      case .add: DispatchSource.makeUserDataAddSource(queue: queue)
      case .or: DispatchSource.makeUserDataOrSource(queue: queue)
      case .signal1, .signal2: DispatchSource.makeSignalSource(signal: kind.signalNumber, queue: queue)
      }
    return .success(DispatchSourceHandle(source))
  }

  private func raw(_ source: SourceHandle) -> DispatchSourceProtocol { (source as! DispatchSourceHandle).source }

  func setEventHandler(_ source: SourceHandle, _ handler: @escaping @Sendable (UInt) -> Void) {
    // The source's data, read in the handler as a user of `import Dispatch` reads it; the source
    // is held weakly, as libdispatch's own examples advise, so the handler holds no cycle.
    let box = WeakSource(raw(source))
    raw(source).setEventHandler { handler(box.source?.data ?? 0) }
  }

  func clearEventHandler(_ source: SourceHandle) { raw(source).setEventHandler(handler: nil) }

  func setCancelHandler(_ source: SourceHandle, _ handler: @escaping @Sendable () -> Void) {
    raw(source).setCancelHandler(handler: handler)
  }

  func setRegistrationHandler(_ source: SourceHandle, _ handler: @escaping @Sendable () -> Void) {
    raw(source).setRegistrationHandler(handler: handler)
  }

  func resume(_ source: SourceHandle) { raw(source).resume() }
  func suspend(_ source: SourceHandle) { raw(source).suspend() }
  func cancel(_ source: SourceHandle) { raw(source).cancel() }

  func merge(_ source: SourceHandle, _ value: UInt) {
    switch raw(source) {
    case let add as DispatchSourceUserDataAdd: add.add(data: value)
    case let or as DispatchSourceUserDataOr: or.or(data: value)
    default: break
    }
  }

  func schedule(_ source: SourceHandle, after delay: Duration) {
    let nanoseconds = Int(delay.components.seconds) * 1_000_000_000 + Int(delay.components.attoseconds / 1_000_000_000)
    (raw(source) as? DispatchSourceTimer)?.schedule(
      deadline: .now() + .nanoseconds(nanoseconds), leeway: .nanoseconds(0))
  }
}

private final class WeakSource: @unchecked Sendable {  // written once, before the handler can run
  weak var source: (DispatchSourceProtocol & AnyObject)?
  init(_ source: DispatchSourceProtocol) { self.source = source as AnyObject as? (DispatchSourceProtocol & AnyObject) }
}

// MARK: - GCD

final class GCDSourceHandle: SourceHandle, @unchecked Sendable {  // GCD's sources are Sendable
  let source: GCD.Source
  init(_ source: GCD.Source) { self.source = source }
}

struct GCDSourceDriver: SourceDriver {
  var side: Side { .gcd }
  var dropNeedsBalancing: Bool { false }

  func makeQueue(index: Int) -> AnyObject { indexedGCDQueue(label: "differential.gcd.\(index)", index: index) }

  func sync(_ queue: AnyObject) { (queue as! Queue).sync {} }

  func currentQueue() -> Int? { currentGCDQueueIndex() }

  func create(_ kind: SourceKind, descriptor: Int32, queue: AnyObject) -> Result<SourceHandle, GCDErrorCode> {
    let queue = queue as! Queue
    do {
      let source: GCD.Source =
        switch kind {
        case .read: try ReadSource(fileDescriptor: descriptor, queue: queue)
        case .write: try WriteSource(fileDescriptor: descriptor, queue: queue)
        case .timer: TimerSource(queue: queue)
        case .add: DataAddSource(queue: queue)
        case .or: DataOrSource(queue: queue)
        case .signal1, .signal2: try SignalSource(signal: kind.signalNumber, queue: queue)
        }
      return .success(GCDSourceHandle(source))
    } catch {
      return .failure(GCDErrorCode(errno: error.errno))
    }
  }

  private func raw(_ source: SourceHandle) -> GCD.Source { (source as! GCDSourceHandle).source }

  func setEventHandler(_ source: SourceHandle, _ handler: @escaping @Sendable (UInt) -> Void) {
    switch raw(source) {
    case let read as ReadSource: read.setEventHandler { value in handler(value) }
    case let write as WriteSource: write.setEventHandler { value in handler(value) }
    case let timer as TimerSource: timer.setEventHandler { value in handler(value) }
    case let add as DataAddSource: add.setEventHandler { value in handler(value) }
    case let or as DataOrSource: or.setEventHandler { value in handler(value) }
    case let signal as SignalSource: signal.setEventHandler { value in handler(value) }
    default: preconditionFailure("no such source kind in the sequences")
    }
  }

  /// `IntendedDifference.noEventHandlerClear`: an empty handler.
  func clearEventHandler(_ source: SourceHandle) { raw(source).setEventHandler {} }

  func setCancelHandler(_ source: SourceHandle, _ handler: @escaping @Sendable () -> Void) {
    raw(source).setCancelHandler(handler)
  }

  func setRegistrationHandler(_ source: SourceHandle, _ handler: @escaping @Sendable () -> Void) {
    raw(source).setRegistrationHandler(handler)
  }

  func resume(_ source: SourceHandle) { raw(source).resume() }
  func suspend(_ source: SourceHandle) { raw(source).suspend() }
  func cancel(_ source: SourceHandle) { raw(source).cancel() }

  func merge(_ source: SourceHandle, _ value: UInt) {
    switch raw(source) {
    case let add as DataAddSource: add.merge(value)
    case let or as DataOrSource: or.merge(value)
    default: break
    }
  }

  func schedule(_ source: SourceHandle, after delay: Duration) {
    (raw(source) as? TimerSource)?.schedule(start: .now + delay)
  }
}
