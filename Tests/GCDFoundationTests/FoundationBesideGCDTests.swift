// A file that imports Foundation — which re-exports Dispatch — beside GCD, as most Linux services'
// files do. Every name of the public API contract (shared/DESIGN.md) is used here unqualified: a
// name that became ambiguous with Dispatch's would stop this target from compiling. The two that
// clashed before 1.0 (`DispatchObject`, `dispatchMain()`) appear only in their new spellings,
// `GCDObject` and `Queue.dispatchMain()`.
import Foundation
import GCD
import Synchronization
import Testing

@Suite("Foundation beside GCD")
struct FoundationBesideGCDTests {
  @Test("deadlines and durations: Deadline.now, .forever, wallClock(), deadline + .milliseconds(5)")
  func deadlines() {
    let now = Deadline.now
    #expect(now + .milliseconds(5) > now)
    #expect(Deadline.forever.isForever)
    #expect(Deadline.wallClock() < .forever)
    // Foundation's own types keep their names beside GCD's.
    #expect(Date().timeIntervalSince1970 > 0)
    #expect(DispatchTime.now() <= DispatchTime.now())
  }

  @Test("queues: creation, the globals, async, sync, barriers, after, apply, the C-function form")
  func queues() {
    let queue = Queue(label: "foundation.queue", kind: .concurrent, target: Queue.global(.high))
    #expect(queue.label == "foundation.queue")
    #expect(Queue.main.label == "com.apple.main-thread")
    #expect(Queue.global() === Queue.global(.default))
    #expect(Queue.global(.low) !== Queue.global(.background))
    let ran = Mutex(0)
    queue.async { ran.withLock { $0 += 1 } }
    queue.asyncBarrier { ran.withLock { $0 += 1 } }
    queue.syncBarrier {}
    #expect(queue.sync { ran.withLock { $0 } } == 2)
    let later = Group()
    later.enter()
    queue.after(.milliseconds(1)) { later.leave() }
    #expect(later.wait(timeout: .seconds(10)))
    later.enter()
    queue.after(deadline: .now + .milliseconds(1)) { later.leave() }
    #expect(later.wait(timeout: .seconds(10)))
    let total = Atomic(0)
    queue.apply(10) { index in total.add(index, ordering: .relaxed) }
    #expect(total.load(ordering: .relaxed) == 45)
    let serial = Queue(label: "foundation.serial")
    serial.suspend()
    serial.resume()
    serial.setTarget(Queue.global())
    let box = Unmanaged.passRetained(Counted())
    serial.async(context: box.toOpaque(), function: countAndRelease)
    serial.sync {}
    #expect(Counted.calls.load(ordering: .relaxed) == 1)
    // Referenced, not called: it never returns.
    let drain: () -> Never = Queue.dispatchMain
    _ = drain
  }

  @Test("groups and semaphores")
  func groupsAndSemaphores() throws {
    let group = Group()
    let queue = Queue(label: "foundation.group")
    group.async(on: queue) {}
    group.enter()
    group.leave()
    group.wait()
    #expect(group.wait(timeout: .zero))
    let notified = try Semaphore(value: 0)
    group.notify(on: queue) { notified.signal() }
    notified.wait()
    #expect(!notified.wait(timeout: .zero))
    #expect(throws: GCDError.self) { _ = try Semaphore(value: -1) }
  }

  @Test("every source type, its handlers, life cycle, data, mask and handle")
  func sources() throws {
    let queue = Queue(label: "foundation.sources")
    let timer = TimerSource(queue: queue)
    timer.schedule(start: .now, interval: .milliseconds(1), leeway: .zero)
    let add = DataAddSource(queue: queue)
    let or = DataOrSource(queue: queue)
    let replace = DataReplaceSource(queue: queue)
    var pipeEnds: [Int32] = [0, 0]
    #expect(pipe(&pipeEnds) == 0)
    defer { pipeEnds.forEach { _ = close($0) } }
    let read = try ReadSource(fileDescriptor: pipeEnds[0], queue: queue)
    let write = try WriteSource(fileDescriptor: pipeEnds[1], queue: queue)
    // A signal no test of the other target uses: a second source of theirs, or their
    // `signal(_, SIG_IGN)` after this one registered, would change what their sources see.
    #expect(SignalSource.canObserve(SIGVTALRM))
    let signal = try SignalSource(signal: SIGVTALRM, queue: queue)
    let process = try ProcSource(pid: getpid(), events: .exit, queue: queue)
    let file = try FileSystemSource(path: "/tmp", events: [.write, .rename], queue: queue)
    let all: [Source] = [timer, add, or, replace, read, write, signal, process, file]
    let cancelled = Group()
    for source in all {
      source.setEventHandler {}
      source.setRegistrationHandler {}
      cancelled.enter()
      source.setCancelHandler { cancelled.leave() }
      source.setTarget(queue)
      source.resume()
      source.suspend()
      source.resume()
      _ = (source.data, source.mask, source.handle)
    }
    add.merge(1)
    or.merge(2)
    replace.merge(3)
    _ = (read.bytesAvailable, signal.count)
    #expect(ProcEvents.exit.rawValue != 0 && !FileSystemEvents([.delete, .extend, .attrib, .link, .revoke]).isEmpty)
    for source in all { source.cancel() }
    #expect(cancelled.wait(timeout: .seconds(10)))
    #expect(all.allSatisfy { $0.isCancelled })
  }

  @Test(
    "events and handlers: src.events, setEventHandler { value in }, SignalSource.sequence(of:)",
    .timeLimit(.minutes(1)))
  func eventsAndHandlers() async throws {
    let queue = Queue(label: "foundation.events")
    let source = DataAddSource(queue: queue)
    let events = source.makeEvents()  // starts the source
    source.merge(3)
    for try await value in events {
      #expect(value == 3)
      break
    }
    #expect(source.isCancelled)
    let valued = DataOrSource(queue: queue)
    let seen = Mutex<UInt>(0)
    let done = Group()
    done.enter()
    valued.setEventHandler { value in
      seen.withLock { $0 = value }
      done.leave()
    }
    valued.resume()
    valued.merge(0b101)
    try await done.wait()
    #expect(seen.withLock { $0 } == 0b101)
    valued.cancel()
    let signals = try SignalSource.sequence(of: [SIGVTALRM, SIGXCPU])
    _ = signals  // dropped: its sources are cancelled
  }

  @Test("every wrapper is a GCDObject with a context slot and a finalizer")
  func objects() throws {
    let objects: [GCDObject] = [
      Queue(label: "foundation.object"), Group(), try Semaphore(value: 1), DataAddSource(queue: Queue.global()),
    ]
    for object in objects {
      let marker = UnsafeMutableRawPointer(bitPattern: 0x1)
      object.context = marker
      #expect(object.context == marker)
      object.context = nil
      object.setFinalizer(nil)
    }
  }
}

private final class Counted: Sendable {
  static let calls = Atomic(0)
}

private func countAndRelease(_ context: UnsafeMutableRawPointer?) {
  Counted.calls.add(1, ordering: .relaxed)
  Unmanaged<Counted>.fromOpaque(context!).release()
}
