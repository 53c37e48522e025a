// What the scenario sequences add to the channel drivers: one-shot reads and writes, and the async
// face (`read(upTo:)`, `write(_:)`), on GCD directly and on `DispatchIO` through a model of what
// GCD's async forms promise (docs/io.md, "The async face").
import Dispatch
import GCD
import Synchronization

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// How an awaited call ended.
enum CallOutcome: Sendable, Equatable {
  /// `read(upTo:)` returned bytes.
  case bytes([UInt8])
  /// `read(upTo:)` returned an empty buffer: the end of file.
  case end
  /// `write(_:)` returned.
  case written
  /// The call threw `GCDError` with this errno.
  case failed(Int32)
}

/// A channel's async face.
protocol AsyncFace: Sendable {
  func read(upTo length: Int) async -> CallOutcome
  func write(_ bytes: [UInt8]) async -> CallOutcome
  /// Whether a `read(upTo:)` call waits for bytes.
  var isReadWaiting: Bool { get }
  /// Writes still under way that no call waits for (the Dispatch model's, after a cancellation).
  var writesInFlight: Int { get }
  /// The channel was closed (the Dispatch model ends a call it would make wait with ECANCELED, as
  /// libdispatch ends a read submitted after the close).
  func closed()
}

/// The one-shot calls of a side.
protocol OneShotDriver: Sendable {
  func oneShotRead(
    descriptor: Int32, length: Int, queue: AnyObject, handler: @escaping @Sendable ([UInt8], Int32) -> Void)
  /// `handler` gets the count of bytes left unwritten and the errno.
  func oneShotWrite(
    descriptor: Int32, bytes: [UInt8], queue: AnyObject, handler: @escaping @Sendable (Int, Int32) -> Void)
  func asyncFace(_ channel: ChannelHandle) -> AsyncFace
}

/// The executor of the scenarios' tasks: a queue of their own, so that a task waiting for a
/// channel never needs the cooperative pool, which belongs to the other suites.
final class ScenarioExecutor: TaskExecutor {
  static let shared = ScenarioExecutor()
  private let queue = DispatchQueue(label: "differential.scenario.tasks")

  func enqueue(_ job: consuming ExecutorJob) {
    let job = UnownedJob(job)
    let executor = asUnownedTaskExecutor()
    queue.async { job.runSynchronously(on: executor) }
  }
}

// MARK: - GCD

struct GCDAsyncFace: AsyncFace {
  let channel: IOChannel

  func read(upTo length: Int) async -> CallOutcome {
    do {
      let bytes = try await channel.read(upTo: length)
      return bytes.isEmpty ? .end : .bytes(Array(bytes))
    } catch {
      return .failed(error.errno)
    }
  }

  func write(_ bytes: [UInt8]) async -> CallOutcome {
    do {
      try await channel.write(bytes)
      return .written
    } catch {
      return .failed(error.errno)
    }
  }

  var isReadWaiting: Bool { channel.reader.state.withLock { $0.isWaiting } }
  var writesInFlight: Int { 0 }
  func closed() {}
}

extension GCDChannelDriver: OneShotDriver {
  func oneShotRead(
    descriptor: Int32, length: Int, queue: AnyObject, handler: @escaping @Sendable ([UInt8], Int32) -> Void
  ) {
    IOChannel.read(fileDescriptor: descriptor, length: length, queue: queue as! Queue) { data, error in
      handler(Array(data), error)
    }
  }

  func oneShotWrite(
    descriptor: Int32, bytes: [UInt8], queue: AnyObject, handler: @escaping @Sendable (Int, Int32) -> Void
  ) {
    IOChannel.write(fileDescriptor: descriptor, data: DispatchBuffer(bytes), queue: queue as! Queue) {
      remaining, error in
      handler(remaining.count, error)
    }
  }

  func asyncFace(_ channel: ChannelHandle) -> AsyncFace {
    GCDAsyncFace(channel: (channel as! GCDChannelHandle).channel)
  }
}

// MARK: - import Dispatch

extension DispatchChannelDriver: OneShotDriver {
  func oneShotRead(
    descriptor: Int32, length: Int, queue: AnyObject, handler: @escaping @Sendable ([UInt8], Int32) -> Void
  ) {
    DispatchIO.read(fromFileDescriptor: descriptor, maxLength: length, runningHandlerOn: queue as! DispatchQueue) {
      data, error in
      handler([UInt8](data), error)
    }
  }

  func oneShotWrite(
    descriptor: Int32, bytes: [UInt8], queue: AnyObject, handler: @escaping @Sendable (Int, Int32) -> Void
  ) {
    let data = bytes.withUnsafeBytes { DispatchData(bytes: $0) }
    DispatchIO.write(toFileDescriptor: descriptor, data: data, runningHandlerOn: queue as! DispatchQueue) {
      rest, error in
      handler(rest?.count ?? 0, error)
    }
  }

  func asyncFace(_ channel: ChannelHandle) -> AsyncFace {
    DispatchAsyncFace(io: (channel as! DispatchChannelHandle).io)
  }
}

/// GCD's async face modelled on a `DispatchIO` stream channel (low-water mark 1): a call that finds
/// bytes kept returns them; otherwise it waits for the first delivery of a `read` of its length
/// (one in flight at a time), and the bytes that read delivers beyond what the call returns are
/// kept for the next call. A read's end (end of file, an error) ends one call. A call by a task
/// already cancelled throws ECANCELED and stops nothing; a second call while one waits, EBUSY; a
/// waiting call cancelled throws ECANCELED and stops the reads (later calls throw ECANCELED; what
/// the read in flight delivers is dropped). A `write` awaited in a continuation; a pending write
/// cancelled throws ECANCELED and stops the writes (the `DispatchIO` write goes on unawaited:
/// one direction of a channel cannot be stopped alone); one cancelled after it ended changes
/// nothing.
final class DispatchAsyncFace: AsyncFace, Sendable {
  struct State {
    var kept: [UInt8] = []
    var inFlight = false
    var requested = 0
    var received = 0
    /// How the last read ended, owed to the next call: 0 at end of file, else the errno.
    var ended: Int32?
    var readsStopped = false
    var writesStopped = false
    var waiter: (continuation: CheckedContinuation<CallOutcome, Never>, limit: Int, call: UInt64)?
    var nextCall: UInt64 = 0
    var writers: [UInt64: CheckedContinuation<CallOutcome, Never>] = [:]
    var writesInFlight = 0
    var closed = false
  }

  let io: DispatchIO
  let state = Mutex(State())
  private let queue = DispatchQueue(label: "differential.scenario.async-model")

  init(io: DispatchIO) { self.io = io }

  var isReadWaiting: Bool { state.withLock { $0.waiter != nil } }
  var writesInFlight: Int { state.withLock { $0.writesInFlight } }

  func closed() { state.withLock { $0.closed = true } }

  func read(upTo length: Int) async -> CallOutcome {
    if Task.isCancelled { return .failed(ECANCELED) }
    let call = state.withLock { state -> UInt64 in
      state.nextCall += 1
      return state.nextCall
    }
    return await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<CallOutcome, Never>) in
        let (now, start) = state.withLock { state -> (CallOutcome?, Bool) in
          if state.readsStopped { return (.failed(ECANCELED), false) }
          if state.waiter != nil { return (.failed(EBUSY), false) }
          if length == 0 { return (.bytes([]), false) }
          if !state.kept.isEmpty { return (.bytes(Self.take(length, &state)), false) }
          if let ended = state.ended {
            state.ended = nil
            return (ended == 0 ? .end : .failed(ended), false)
          }
          // The package's read of a closed channel is a new read, which libdispatch ends so.
          if state.closed { return (.failed(ECANCELED), false) }
          state.waiter = (continuation, length, call)
          if state.inFlight { return (nil, false) }
          state.inFlight = true
          state.requested = length
          state.received = 0
          return (nil, true)
        }
        if let now {
          continuation.resume(returning: now)
          return
        }
        if start {
          io.read(offset: 0, length: length, queue: queue) { [self] done, data, error in
            delivered(done: done, bytes: data.map { [UInt8]($0) } ?? [], error: error)
          }
        }
        if Task.isCancelled { cancelRead(call) }
      }
    } onCancel: {
      cancelRead(call)
    }
  }

  private static func take(_ limit: Int, _ state: inout State) -> [UInt8] {
    let count = min(limit, state.kept.count)
    let taken = Array(state.kept[0..<count])
    state.kept.removeFirst(count)
    return taken
  }

  private func cancelRead(_ call: UInt64) {
    let waiter = state.withLock { state -> CheckedContinuation<CallOutcome, Never>? in
      guard let waiter = state.waiter, waiter.call == call else { return nil }
      state.waiter = nil
      state.readsStopped = true
      state.kept = []
      return waiter.continuation
    }
    waiter?.resume(returning: .failed(ECANCELED))
  }

  private func delivered(done: Bool, bytes: [UInt8], error: Int32) {
    let resume = state.withLock { state -> (CheckedContinuation<CallOutcome, Never>, CallOutcome)? in
      if done { state.inFlight = false }
      if state.readsStopped { return nil }
      state.kept += bytes
      state.received += bytes.count
      if done {
        if error != 0 {
          state.ended = error
        } else if state.received < state.requested {
          state.ended = 0
        }
      }
      guard let waiter = state.waiter else { return nil }
      if !state.kept.isEmpty {
        state.waiter = nil
        return (waiter.continuation, .bytes(Self.take(waiter.limit, &state)))
      }
      if let ended = state.ended {
        state.waiter = nil
        state.ended = nil
        return (waiter.continuation, ended == 0 ? .end : .failed(ended))
      }
      // A read that ended with all it asked for and nothing kept: the waiter needs another.
      if done && !state.inFlight {
        state.inFlight = true
        state.requested = waiter.limit
        state.received = 0
        let limit = waiter.limit
        queue.async { [self] in
          io.read(offset: 0, length: limit, queue: queue) { [self] done, data, error in
            delivered(done: done, bytes: data.map { [UInt8]($0) } ?? [], error: error)
          }
        }
      }
      return nil
    }
    if let (continuation, outcome) = resume { continuation.resume(returning: outcome) }
  }

  func write(_ bytes: [UInt8]) async -> CallOutcome {
    if Task.isCancelled { return .failed(ECANCELED) }
    let call = state.withLock { state -> UInt64? in
      if state.writesStopped { return nil }
      state.nextCall += 1
      return state.nextCall
    }
    guard let call else { return .failed(ECANCELED) }
    return await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<CallOutcome, Never>) in
        state.withLock {
          $0.writers[call] = continuation
          $0.writesInFlight += 1
        }
        let data = bytes.withUnsafeBytes { DispatchData(bytes: $0) }
        io.write(offset: 0, data: data, queue: queue) { [self] done, _, error in
          guard done else { return }
          let waiter = state.withLock { state in
            state.writesInFlight -= 1
            return state.writers.removeValue(forKey: call)
          }
          waiter?.resume(returning: error == 0 ? .written : .failed(error))
        }
        if Task.isCancelled { cancelWrite(call) }
      }
    } onCancel: {
      cancelWrite(call)
    }
  }

  private func cancelWrite(_ call: UInt64) {
    let waiter = state.withLock { state -> CheckedContinuation<CallOutcome, Never>? in
      guard let waiter = state.writers.removeValue(forKey: call) else { return nil }
      state.writesStopped = true
      return waiter
    }
    waiter?.resume(returning: .failed(ECANCELED))
  }
}
