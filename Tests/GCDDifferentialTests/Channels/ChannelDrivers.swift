// The two implementations a channel sequence runs through: `DispatchIO` (.stream) and GCD's
// `IOChannel` (.stream), behind one small interface.
import Dispatch
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

protocol ChannelHandle: AnyObject, Sendable {}

/// What a read or write handler call carried: done, the bytes (for a read), the count of bytes
/// (delivered for a read, still to write for a write) and the errno.
typealias ChannelCall = @Sendable (_ done: Bool, _ bytes: [UInt8], _ count: Int, _ error: Int32) -> Void

protocol ChannelDriver: Sendable {
  var side: Side { get }
  /// Queue 0 serial, queue 1 concurrent; `currentQueue` tells them apart.
  func makeQueue(index: Int) -> AnyObject
  /// Waits until everything submitted to `queue` so far ran (a barrier on the concurrent one).
  func sync(_ queue: AnyObject)
  func currentQueue() -> Int?
  func open(descriptor: Int32, queue: AnyObject, cleanup: @escaping @Sendable (Int32) -> Void) -> ChannelHandle
  func open(from channel: ChannelHandle, queue: AnyObject, cleanup: @escaping @Sendable (Int32) -> Void)
    -> ChannelHandle
  func read(_ channel: ChannelHandle, length: Int, queue: AnyObject, handler: @escaping ChannelCall)
  func write(_ channel: ChannelHandle, bytes: [UInt8], queue: AnyObject, handler: @escaping ChannelCall)
  func setLimit(_ channel: ChannelHandle, lowWater: Int?, highWater: Int?)
  func barrier(_ channel: ChannelHandle, _ body: @escaping @Sendable () -> Void)
  func close(_ channel: ChannelHandle, stop: Bool)
}

// MARK: - import Dispatch

final class DispatchChannelHandle: ChannelHandle, @unchecked Sendable {  // DispatchIO is thread-safe
  let io: DispatchIO
  init(_ io: DispatchIO) { self.io = io }
}

struct DispatchChannelDriver: ChannelDriver {
  var side: Side { .dispatch }

  func makeQueue(index: Int) -> AnyObject {
    indexedDispatchQueue(
      label: "differential.io.dispatch.\(index)", index: index, attributes: index == 1 ? .concurrent : [])
  }

  func sync(_ queue: AnyObject) { (queue as! DispatchQueue).sync(flags: .barrier) {} }

  func currentQueue() -> Int? { currentDispatchQueueIndex() }

  private func io(_ channel: ChannelHandle) -> DispatchIO { (channel as! DispatchChannelHandle).io }

  func open(descriptor: Int32, queue: AnyObject, cleanup: @escaping @Sendable (Int32) -> Void) -> ChannelHandle {
    let io = DispatchIO(
      type: .stream, fileDescriptor: descriptor, queue: queue as! DispatchQueue, cleanupHandler: cleanup)
    // `IntendedDifference.smallReadsAtOnce`: the package's stream reads start at 1 byte.
    io.setLimit(lowWater: 1)
    return DispatchChannelHandle(io)
  }

  func open(from channel: ChannelHandle, queue: AnyObject, cleanup: @escaping @Sendable (Int32) -> Void)
    -> ChannelHandle
  {
    let parent = io(channel)
    let io = DispatchIO(type: .stream, io: parent, queue: queue as! DispatchQueue, cleanupHandler: cleanup)
    io.setLimit(lowWater: 1)
    // libdispatch makes the channel later, on the parent's queue and then the descriptor's barrier
    // queue, and a parent stopped meanwhile (a drop at the next step) ends it with ECANCELED: a
    // matter of timing. Its descriptor (0 until then: the object starts zeroed) is the parent's
    // once it is made; the package's is made in call order.
    let number = parent.fileDescriptor
    let clock = ContinuousClock()
    let end = clock.now + .seconds(2)
    while number >= 0 && io.fileDescriptor != number && parent.fileDescriptor >= 0 && clock.now < end {
      usleep(200)
    }
    return DispatchChannelHandle(io)
  }

  func read(_ channel: ChannelHandle, length: Int, queue: AnyObject, handler: @escaping ChannelCall) {
    io(channel).read(offset: 0, length: length, queue: queue as! DispatchQueue) { done, data, error in
      let bytes = data.map { [UInt8]($0) } ?? []
      handler(done, bytes, bytes.count, error)
    }
  }

  func write(_ channel: ChannelHandle, bytes: [UInt8], queue: AnyObject, handler: @escaping ChannelCall) {
    let data = bytes.withUnsafeBytes { DispatchData(bytes: $0) }
    io(channel).write(offset: 0, data: data, queue: queue as! DispatchQueue) { done, rest, error in
      handler(done, [], rest?.count ?? 0, error)
    }
  }

  func setLimit(_ channel: ChannelHandle, lowWater: Int?, highWater: Int?) {
    if let lowWater { io(channel).setLimit(lowWater: lowWater) }
    if let highWater { io(channel).setLimit(highWater: highWater) }
  }

  func barrier(_ channel: ChannelHandle, _ body: @escaping @Sendable () -> Void) { io(channel).barrier(execute: body) }

  func close(_ channel: ChannelHandle, stop: Bool) { io(channel).close(flags: stop ? .stop : []) }
}

// MARK: - GCD

final class GCDChannelHandle: ChannelHandle, @unchecked Sendable {  // IOChannel is Sendable
  let channel: IOChannel
  init(_ channel: IOChannel) { self.channel = channel }
}

struct GCDChannelDriver: ChannelDriver {
  var side: Side { .gcd }

  func makeQueue(index: Int) -> AnyObject {
    indexedGCDQueue(label: "differential.io.gcd.\(index)", index: index, kind: index == 1 ? .concurrent : .serial)
  }

  func sync(_ queue: AnyObject) { (queue as! Queue).syncBarrier {} }

  func currentQueue() -> Int? { currentGCDQueueIndex() }

  private func io(_ channel: ChannelHandle) -> IOChannel { (channel as! GCDChannelHandle).channel }

  func open(descriptor: Int32, queue: AnyObject, cleanup: @escaping @Sendable (Int32) -> Void) -> ChannelHandle {
    GCDChannelHandle(IOChannel(fileDescriptor: descriptor, type: .stream, queue: queue as! Queue, cleanup: cleanup))
  }

  func open(from channel: ChannelHandle, queue: AnyObject, cleanup: @escaping @Sendable (Int32) -> Void)
    -> ChannelHandle
  {
    GCDChannelHandle(IOChannel(channel: io(channel), type: .stream, queue: queue as! Queue, cleanup: cleanup))
  }

  func read(_ channel: ChannelHandle, length: Int, queue: AnyObject, handler: @escaping ChannelCall) {
    io(channel).read(length: length, queue: queue as! Queue) { done, data, error in
      let bytes = data.map { Array($0) } ?? []
      handler(done, bytes, bytes.count, error)
    }
  }

  func write(_ channel: ChannelHandle, bytes: [UInt8], queue: AnyObject, handler: @escaping ChannelCall) {
    io(channel).write(data: bytes, queue: queue as! Queue) { done, rest, error in
      handler(done, [], rest?.count ?? 0, error)
    }
  }

  func setLimit(_ channel: ChannelHandle, lowWater: Int?, highWater: Int?) {
    io(channel).setLimit(lowWater: lowWater, highWater: highWater)
  }

  func barrier(_ channel: ChannelHandle, _ body: @escaping @Sendable () -> Void) { io(channel).barrier(body) }

  func close(_ channel: ChannelHandle, stop: Bool) { io(channel).close(stop: stop) }
}
