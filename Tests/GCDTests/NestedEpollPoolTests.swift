import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// The pool of idle epoll instances (EpollNest; docs/sources-linux.md, "Reusing the instances"):
// a cancelled descriptor source gives its instance back, emptied, before its cancel handler, and
// the next source takes it. Each test runs in a child process: the pool is the process's.
extension NestedEpollTests {
  @Test("a cancelled source's epoll instance is emptied before its cancel handler and reused by the next source")
  func poolReuse() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkPoolReuse()
    }
    let text = standardError(of: result)
    #expect(text.contains("exit-test child: ok"), "\(text)")
  }

  @Test("at most EpollNest.poolCapacity idle instances are kept; the others are closed")
  func poolBounded() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkPoolBounded()
    }
    let text = standardError(of: result)
    #expect(text.contains("exit-test child: ok"), "\(text)")
  }

  @Test("an instance whose descriptor was closed before the cancel handler is closed, not reused")
  func poolSkipsClosedDescriptor() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkPoolSkipsClosedDescriptor()
    }
    let text = standardError(of: result)
    #expect(text.contains("exit-test child: ok"), "\(text)")
  }
}

/// The epoll instances that watch `descriptor` and nothing else: the nests that hold it (a nest
/// holds its source's descriptor alone; libdispatch's own instance watches many).
private func nests(watching descriptor: Int32) -> Set<Int32> {
  Set(
    allOpenDescriptorTargets().filter { number, target in
      target.contains("eventpoll") && epollTargets(of: number) == [descriptor]
    }.keys)
}

/// Cancels `source` and waits for its cancel handler, which runs `inHandler` first.
@available(*, noasync, message: "blocks the thread")
private func cancelAndWait(_ source: Source, inHandler: @escaping @Sendable () -> Void = {}) {
  let cancelled = Event()
  source.setCancelHandler {
    inHandler()
    cancelled.signal()
  }
  source.cancel()
  requireInChild(cancelled, "the cancel handler did not run")
}

private func checkPoolReuse() -> Never {
  warmUpDispatch()
  let queue = Queue(label: "nest.pool.reuse")
  let (firstRead, firstWrite) = makePipe()
  let first: ReadSource
  do { first = try ReadSource(fileDescriptor: firstRead, queue: queue) } catch { endChild("failed: \(error)") }
  first.setEventHandler {}
  first.resume()
  let firstNests = nests(watching: firstRead)
  childCheck(firstNests.count == 1, "the first source's descriptor is in \(firstNests.count) epoll instances, not 1")
  let nest = firstNests.first!
  // In the handler the nest has let the descriptor go, so closing it there is the user's to do.
  let heldInHandler = Atomic<Bool>(true)
  cancelAndWait(first) {
    heldInHandler.store(!nests(watching: firstRead).isEmpty, ordering: .relaxed)
    close(firstRead)
  }
  childCheck(!heldInHandler.load(ordering: .relaxed), "the nest still held the descriptor in the cancel handler")
  childCheck(idleEpollInstances().contains(nest), "the cancelled source's instance \(nest) is not idle in the pool")

  // The next source takes that instance, and sees only its own descriptor's events.
  let (secondRead, secondWrite) = makePipe()
  let fired = Event()
  let reads = Mutex<[UInt8]>([])
  let second: ReadSource
  do { second = try ReadSource(fileDescriptor: secondRead, queue: queue) } catch { endChild("failed: \(error)") }
  childCheck(nests(watching: secondRead) == [nest], "the second source did not reuse instance \(nest)")
  second.setEventHandler {
    var byte: UInt8 = 0
    while read(secondRead, &byte, 1) == 1 { reads.withLock { $0.append(byte) } }
    fired.signal()
  }
  second.resume()
  var byte: UInt8 = 42
  _ = write(secondWrite, &byte, 1)
  requireInChild(fired, "the source on a reused instance got no event")
  childCheck(reads.withLock { $0 } == [42], "the source on a reused instance read \(reads.withLock { $0 })")
  cancelAndWait(second) { close(secondRead) }
  close(firstWrite)
  close(secondWrite)
  endChild("ok: instance \(nest) emptied before the cancel handler, reused by the next source")
}

private func checkPoolBounded() -> Never {
  warmUpDispatch()
  let count = EpollNest.poolCapacity * 3
  let queue = Queue(label: "nest.pool.bounded")
  let pipes = (0..<count).map { _ in makePipe() }
  let idleBefore = idleEpollInstances()
  let sources: [ReadSource]
  do {
    sources = try pipes.map { try ReadSource(fileDescriptor: $0.read, queue: queue) }
  } catch {
    endChild("failed: \(error)")
  }
  let live = Set(pipes.flatMap { nests(watching: $0.read) })
  childCheck(live.count == count, "\(live.count) epoll instances for \(count) sources")
  childCheck(
    idleEpollInstances().isEmpty, "idle instances left while \(count) sources were made: the pool was not used")
  let cancelled = Latch(count: count)
  for (source, ends) in zip(sources, pipes) {
    source.setEventHandler {}
    source.setCancelHandler {
      close(ends.read)
      cancelled.signal()
    }
    source.resume()
  }
  for source in sources { source.cancel() }
  requireInChild(cancelled, "cancel handlers did not run")
  let idle = idleEpollInstances()
  childCheck(
    idle.count == EpollNest.poolCapacity,
    "\(idle.count) idle instances after \(count) sources ended, not \(EpollNest.poolCapacity)")
  let closed = live.subtracting(idle).filter { fcntl($0, F_GETFD) == -1 && errno == EBADF }
  childCheck(
    closed.count == count - EpollNest.poolCapacity,
    "\(closed.count) instances closed, not \(count - EpollNest.poolCapacity)")
  for ends in pipes { close(ends.write) }
  endChild("ok: \(idleBefore.count) idle before, \(idle.count) kept of \(count), \(closed.count) closed")
}

private func checkPoolSkipsClosedDescriptor() -> Never {
  warmUpDispatch()
  let queue = Queue(label: "nest.pool.closed")
  let (readEnd, writeEnd) = makePipe()
  // A second reference keeps the pipe open after the user closes `readEnd` too early: the nest's
  // registration of the pipe then outlives the number, and the instance must not be reused.
  let kept = dup(readEnd)
  let source: ReadSource
  do { source = try ReadSource(fileDescriptor: readEnd, queue: queue) } catch { endChild("failed: \(error)") }
  source.setEventHandler {}
  source.resume()
  let nest = nests(watching: readEnd)
  childCheck(nest.count == 1, "\(nest.count) instances hold the descriptor")
  close(readEnd)  // misuse: before the cancel handler
  cancelAndWait(source)
  let instance = nest.first!
  childCheck(
    fcntl(instance, F_GETFD) == -1 && errno == EBADF && !idleEpollInstances().contains(instance),
    "instance \(instance) was kept after its descriptor was closed early")
  // The next source's instance does not wake for the old pipe.
  let (otherRead, otherWrite) = makePipe()
  let wrongEvents = Atomic<Int>(0)
  let other: ReadSource
  do { other = try ReadSource(fileDescriptor: otherRead, queue: queue) } catch { endChild("failed: \(error)") }
  other.setEventHandler {
    var byte: UInt8 = 0
    if read(otherRead, &byte, 1) < 0 && errno == EAGAIN { wrongEvents.add(1, ordering: .relaxed) }
  }
  other.resume()
  var byte: UInt8 = 1
  _ = write(writeEnd, &byte, 1)  // the old pipe becomes readable
  childCheck(!pollBriefly { wrongEvents.load(ordering: .relaxed) > 0 }, "a new source woke for the old pipe")
  cancelAndWait(other) { close(otherRead) }
  close(kept)
  close(writeEnd)
  close(otherWrite)
  endChild("ok: the instance was closed; the next source sees only its own pipe")
}

// The kernel allows at most 500 paths through nested epoll instances to one open file
// (`reverse_path_check`): with a nest per source, the 501st source on one file — dups of one
// socket, or the same descriptor — failed its registration in libdispatch (EINVAL, unseen: its
// registration handler still ran) and never fired. On the commit before the limit, 100 of these 600
// sources never fired. Sources past `EpollNest.nestsPerFileLimit` on one file are watched directly.
extension NestedEpollTests {
  @Test("600 read sources on one socket (dups and the descriptor itself) all register and all fire")
  func manySourcesOnOneFile() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkManySourcesOnOneFile()
    }
    let text = standardError(of: result)
    #expect(text.contains("exit-test child: ok"), "\(text)")
  }
}

private func checkManySourcesOnOneFile() -> Never {
  let count = 600
  let (mine, peer) = makeSocketPair()
  let descriptors = (0..<count).map { $0.isMultiple(of: 2) ? mine : dup(mine) }
  let queue = Queue(label: "nest.one.file")
  let registered = Latch(count: count)
  let fired = Latch(count: count)
  let sources: [ReadSource]
  do {
    sources = try descriptors.map { try ReadSource(fileDescriptor: $0, queue: queue) }
  } catch {
    endChild("failed: \(error)")
  }
  let firedOnce = Mutex<Set<Int>>([])
  for (index, source) in sources.enumerated() {
    source.setRegistrationHandler { registered.signal() }
    source.setEventHandler {
      if firedOnce.withLock({ $0.insert(index).inserted }) { fired.signal() }
    }
    source.resume()
  }
  childCheck(registered.wait(), "\(registered.count) of \(count) sources on one socket never registered")
  var byte: UInt8 = 1
  _ = send(peer, &byte, 1, 0)
  childCheck(fired.wait(), "\(fired.count) of \(count) sources on one readable socket never fired")
  let nested = Set(Set(descriptors).flatMap { nests(watching: $0) }).count
  childCheck(
    nested <= EpollNest.nestsPerFileLimit,
    "\(nested) epoll instances watch one socket, more than \(EpollNest.nestsPerFileLimit)")
  let cancelled = Latch(count: count)
  for source in sources {
    source.setCancelHandler { cancelled.signal() }
    source.cancel()
  }
  requireInChild(cancelled, "cancel handlers did not run")
  for descriptor in Set(descriptors) { close(descriptor) }
  close(peer)
  endChild("ok: \(count) sources on one socket registered and fired; \(nested) through nests")
}
