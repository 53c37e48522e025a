import CGCD
import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// `ProcSource` on Linux: a pidfd (its own from `init(pid:)`, the caller's from `init(pidfd:)`) in
/// the descriptor fence, `.exit` delivered exactly once, an owned descriptor closed exactly once.
@Suite
struct ProcSourceTests {
  @Test func childExitFiresOnceWithExitData() throws {
    let child = try spawnProcess("/bin/sleep", ["30"])
    defer { _ = reapProcess(child) }
    let source = try ProcSource(pid: child, queue: Queue(label: "proc"))
    #expect(source.pid == child)
    #expect(source.handle == UInt(child))
    #expect(source.mask == ProcEvents.exit.rawValue)
    #expect(source.watchedEvents == .exit)
    let seen = Recorder<UInt>()
    let fired = Event()
    source.setEventHandler {
      seen.append(source.data)
      fired.signal()
    }
    source.resume()
    #expect(!fired.wait(timeout: briefTimeout), "no event while the child runs")
    kill(child, SIGKILL)
    #expect(fired.wait())
    #expect(!pollBriefly { seen.count > 1 }, "a pidfd stays readable: .exit must be delivered once")
    #expect(seen.values == [ProcEvents.exit.rawValue])
    source.cancel()
  }

  @Test func processThatExitedBeforeResumeFires() throws {
    let child = try spawnProcess("/bin/true")
    defer { _ = reapProcess(child) }
    // Wait for the exit without reaping: the child stays a zombie.
    var info = siginfo_t()
    #expect(waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT) == 0)
    let source = try ProcSource(pid: child, events: .exit, queue: Queue(label: "proc"))
    let fired = Event()
    let count = Counter()
    source.setEventHandler {
      count.increment()
      fired.signal()
    }
    source.resume()
    #expect(fired.wait())
    #expect(!pollBriefly { count.current > 1 })
    #expect(count.current == 1)
  }

  @Test func processReapedBetweenCreationAndResumeFires() throws {
    let child = try spawnProcess("/bin/true")
    let source = try ProcSource(pid: child, queue: Queue(label: "proc"))
    #expect(reapProcess(child) == 0)
    let fired = Event()
    source.setEventHandler { fired.signal() }
    source.resume()
    #expect(fired.wait(), "the pidfd keeps the process observable after it is reaped")
  }

  @Test func fiveSourcesOnOneChildEachSeeOneExit() throws {
    let child = try spawnProcess("/bin/sleep", ["30"])
    defer { _ = reapProcess(child) }
    let counts = (0..<5).map { _ in Counter() }
    let all = Latch(count: 5)
    let sources = try (0..<5).map { index in
      let source = try ProcSource(pid: child, queue: Queue(label: "proc-\(index)"))
      source.setEventHandler {
        #expect(source.data == ProcEvents.exit.rawValue)
        if counts[index].increment() == 1 { all.signal() }
      }
      source.resume()
      return source
    }
    kill(child, SIGKILL)
    #expect(all.wait())
    #expect(!pollBriefly { counts.contains { $0.current > 1 } })
    #expect(counts.map(\.current) == [1, 1, 1, 1, 1])
    for source in sources { source.cancel() }
  }

  @Test func watchesAProcessThatIsNotItsChild() throws {
    // sh starts a background sleep, prints its pid and exits: the sleep is
    // re-parented (to init or a subreaper) and is not this process's child.
    var output: [Int32] = [0, 0]
    #expect(pipe(&output) == 0)
    for end in output { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
    let shell = try spawnProcess("/bin/sh", ["-c", "/bin/sleep 30 >/dev/null & echo $!"], stdout: output[1])
    close(output[1])
    let text = readToEnd(output[0])
    close(output[0])
    _ = reapProcess(shell)
    let grandchild = try #require(pid_t(text.trimmingCharacters(in: " \n")), "pid from sh: '\(text)'")
    #expect(waitpid(grandchild, nil, WNOHANG) == -1 && errno == ECHILD, "not our child")
    let source = try ProcSource(pid: grandchild, queue: Queue(label: "proc"))
    let fired = Event()
    source.setEventHandler { fired.signal() }
    source.resume()
    #expect(!fired.wait(timeout: briefTimeout))
    kill(grandchild, SIGKILL)
    #expect(fired.wait())
  }

  @Test func watchesItsParent() throws {
    // The parent of the test process outlives the test: no event.
    let source = try ProcSource(pid: getppid(), queue: Queue(label: "proc"))
    let fired = Event()
    source.setEventHandler { fired.signal() }
    source.resume()
    #expect(!fired.wait(timeout: briefTimeout))
    source.cancel()
  }

  @Test func exitWhileSuspendedIsDeliveredOnceAfterResume() throws {
    let child = try spawnProcess("/bin/sleep", ["30"])
    defer { _ = reapProcess(child) }
    let source = try ProcSource(pid: child, queue: Queue(label: "proc"))
    let count = Counter()
    let fired = Event()
    source.setEventHandler {
      count.increment()
      fired.signal()
    }
    source.resume()
    source.suspend()
    kill(child, SIGKILL)
    var info = siginfo_t()
    #expect(waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT) == 0)
    #expect(!fired.wait(timeout: briefTimeout), "suspended: nothing delivered")
    source.resume()
    #expect(fired.wait())
    #expect(!pollBriefly { count.current > 1 })
    #expect(count.current == 1)
  }

  @Test func cancelBeforeExitRunsCancelHandlerAndNoEvent() throws {
    let child = try spawnProcess("/bin/sleep", ["30"])
    defer { _ = reapProcess(child) }
    let source = try ProcSource(pid: child, queue: Queue(label: "proc"))
    let fired = Event()
    let cancelled = Event()
    source.setEventHandler { fired.signal() }
    source.setCancelHandler { cancelled.signal() }
    source.resume()
    source.cancel()
    #expect(cancelled.wait())
    #expect(source.isCancelled)
    kill(child, SIGKILL)
    var info = siginfo_t()
    #expect(waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT) == 0)
    #expect(!fired.wait(timeout: briefTimeout))
  }

  @Test func selfOwnedSourceIsReleasedAfterItCancelsItself() throws {
    // The listing's pattern: the handler holds the only reference, cancels
    // the source, and the source goes away with its handlers.
    let child = try spawnProcess("/bin/sleep", ["30"])
    defer { _ = reapProcess(child) }
    let flag = Event()
    weak var weakSource: ProcSource?
    do {
      let source = try ProcSource(pid: child, queue: .global())
      source.setEventHandler {
        flag.signal()
        source.cancel()
      }
      source.resume()
      weakSource = source
    }
    #expect(weakSource != nil, "the handler keeps the source alive")
    kill(child, SIGKILL)
    #expect(flag.wait())
    #expect(pollUntil { weakSource == nil }, "the source released itself")
  }

  @Test func missingProcessThrowsESRCH() throws {
    let child = try spawnProcess("/bin/true")
    #expect(reapProcess(child) == 0)
    for pid in [child, Int32.max] {
      let error = #expect(throws: GCDError.self) { try ProcSource(pid: pid, queue: .global()) }
      #expect(error?.errno == ESRCH)
      #expect(error?.description.contains("ProcSource(pid: \(pid)") == true)
      #expect(error?.description.contains("ESRCH") == true)
    }
  }

  @Test(arguments: [ProcEvents.fork, .exec, .signal, [.exit, .fork], [.exit, .exec, .signal]])
  func eventsLinuxCannotDeliverThrowENOTSUP(events: ProcEvents) throws {
    let error = #expect(throws: GCDError.self) {
      try ProcSource(pid: getpid(), events: events, queue: .global())
    }
    #expect(error?.errno == ENOTSUP)
    #expect(error?.description.contains("unsupported on Linux") == true)
  }

  @Test("an empty event set throws EINVAL, as FileSystemSource and MemoryPressureSource do (issue 25)")
  func emptyEventsThrowEINVAL() throws {
    for pid in [getpid(), 0] {
      let error = #expect(throws: GCDError.self) { try ProcSource(pid: pid, events: [], queue: .global()) }
      #expect(error?.errno == EINVAL)
      #expect(error?.detail == "no events to watch")
      #expect(error?.description.contains("ProcSource(pid: \(pid), events: [])") == true)
    }
  }

  @Test(arguments: [pid_t(0), -1, -100])
  func invalidPidThrowsEINVAL(pid: pid_t) throws {
    let error = #expect(throws: GCDError.self) { try ProcSource(pid: pid, queue: .global()) }
    #expect(error?.errno == EINVAL)
  }

  @Test(
    "unknown event bits stop the process with a message naming ProcSource, as unknown flags do for TimerSource and WorkItem"
  )
  func unknownEventBitsStop() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      _ = try? ProcSource(pid: getpid(), events: ProcEvents(rawValue: 0x1), queue: .global())
    }
    let text = standardError(of: result)
    #expect(text.contains("GCD: ProcSource(pid: "), "\(text)")
    #expect(text.contains("events: [0x1]): libdispatch knows no such process event (bits 0x1)"), "\(text)")
  }

  @Test func rawValuesMatchTheCFlags() {
    #expect(ProcEvents.exit.rawValue == 0x8000_0000)
    #expect(ProcEvents.fork.rawValue == 0x4000_0000)
    #expect(ProcEvents.exec.rawValue == 0x2000_0000)
    #expect(ProcEvents.signal.rawValue == 0x0800_0000)
    #expect(ProcEvents([.exit, .fork]).description == "[.exit, .fork]")
  }

  @Test func pidDescriptorIsCloseOnExec() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkPidDescriptorIsCloseOnExec()
    }
    expectProcChildOK(result)
  }

  @Test("init(pidfd:) watches the caller's pidfd: .exit once, and the pidfd stays open after the cancel")
  func watchesACallersPidfd() throws {
    let child = try spawnProcess("/bin/sleep", ["30"])
    defer { _ = reapProcess(child) }
    let pidfd = cgcd_pidfd_open(child, 0)
    try #require(pidfd >= 0, "pidfd_open: errno \(errno)")
    defer { close(pidfd) }
    let source = try ProcSource(pidfd: pidfd, queue: Queue(label: "proc.pidfd"))
    #expect(source.pid == child)
    #expect(source.watchedEvents == .exit)
    let seen = Recorder<ProcEvents>()
    let fired = Event()
    let cancelled = Event()
    source.setEventHandler { events in
      seen.append(events)
      fired.signal()
    }
    source.setCancelHandler { cancelled.signal() }
    source.resume()
    kill(child, SIGKILL)
    #expect(fired.wait())
    #expect(!pollBriefly { seen.count > 1 }, "a pidfd stays readable: .exit must be delivered once")
    #expect(seen.values == [.exit])
    source.cancel()
    #expect(cancelled.wait())
    #expect(fcntl(pidfd, F_GETFD) != -1, "the caller's pidfd was closed")
  }

  @Test("resumed before its handler is set, on a process that has exited: .exit once the handler is set, once")
  func handlerSetAfterResume() async throws {
    let child = try spawnProcess("/bin/true")
    defer { _ = reapProcess(child) }
    var info = siginfo_t()
    #expect(waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT) == 0)
    let queue = Queue(label: "proc.late-handler")
    let source = try ProcSource(pid: child, queue: queue)
    source.resume()
    // The exit is ready at once: its event has found no handler by the time this runs on the
    // queue, or it comes after; either way the handler set now sees it once.
    await queue.run {}
    let seen = Recorder<ProcEvents>()
    let fired = Event()
    source.setEventHandler { events in
      seen.append(events)
      fired.signal()
    }
    blocking {
      #expect(fired.wait())
      #expect(!pollBriefly { seen.count > 1 })
    }
    #expect(seen.values == [.exit])
    source.cancel()
  }

  @Test("init(pidfd:) refuses a descriptor that is not a pidfd (EINVAL) and one that is not open (EBADF)")
  func pidfdInitRefusesOtherDescriptors() throws {
    let (readEnd, writeEnd) = makePipe()
    defer {
      close(readEnd)
      close(writeEnd)
    }
    let notPidfd = #expect(throws: GCDError.self) { try ProcSource(pidfd: readEnd, queue: .global()) }
    #expect(notPidfd?.errno == EINVAL, "\(String(describing: notPidfd))")
    let closed = #expect(throws: GCDError.self) { try ProcSource(pidfd: 9999, queue: .global()) }
    #expect(closed?.errno == EBADF, "\(String(describing: closed))")
    let negative = #expect(throws: GCDError.self) { try ProcSource(pidfd: -1, queue: .global()) }
    #expect(negative?.errno == EBADF, "\(String(describing: negative))")
  }

  @Test("descriptors: one per source from a pid (its pidfd, no epoll instance beside it), none from a pidfd")
  func descriptorsPerSource() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkDescriptorsPerProcSource()
    }
    expectProcChildOK(result)
  }

  @Test("an owned pidfd is closed once the exit is delivered, before the source is cancelled")
  func ownedPidfdClosedAfterExit() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkOwnedPidfdClosedAfterExit()
    }
    expectProcChildOK(result)
  }

  @Test func thousandSourcesInEveryStateLeakNoDescriptor() async {
    // In a child process: no other test opens descriptors meanwhile.
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      checkThousandProcSourcesLeakNothing()
    }
    expectProcChildOK(result)
  }
}

// MARK: - Exit-test bodies

private func checkPidDescriptorIsCloseOnExec() -> Never {
  warmUpDispatch()
  let pidfds = { openDescriptorTargets().filter { $0.value.contains("pidfd") } }
  let before = pidfds()
  guard let source = try? ProcSource(pid: getppid(), queue: .global()) else { endProcChild("ProcSource failed") }
  let opened = pidfds().filter { before[$0.key] == nil }
  guard opened.count == 1, let descriptor = opened.first?.key else {
    endProcChild("expected one new pidfd, got \(opened)")
  }
  guard fcntl(descriptor, F_GETFD) & FD_CLOEXEC != 0 else { endProcChild("pidfd \(descriptor) lacks FD_CLOEXEC") }
  source.resume()
  source.cancel()
  guard pollUntil({ pidfds().count == before.count }) else { endProcChild("pidfd not closed on cancel") }
  // Never resumed, dropped: closed too.
  guard (try? ProcSource(pid: getppid(), queue: .global())) != nil else { endProcChild("ProcSource failed") }
  guard pollUntil({ pidfds().count == before.count }) else { endProcChild("pidfd not closed on drop") }
  endProcChild("ok")
}

private func checkDescriptorsPerProcSource() -> Never {
  warmUpDispatch()
  let (child, end) = sleepingChild()
  // The fence's instance, made once for the process: by a first source, before the count; its
  // pidfd closed (in its cancel path, before the cancel handler) before the count too.
  guard let first = try? ProcSource(pid: child, queue: .global()) else { end("ProcSource failed") }
  let cancelled = Event()
  first.setCancelHandler { cancelled.signal() }
  first.cancel()
  guard cancelled.wait() else { end("the first source's cancel handler did not run") }
  let before = allOpenDescriptorTargets().count
  let fromPid = (0..<10).compactMap { _ in try? ProcSource(pid: child, queue: .global()) }
  guard fromPid.count == 10 else { end("ProcSource(pid:) failed") }
  let afterPid = allOpenDescriptorTargets().count
  guard afterPid == before + 10 else { end("10 sources from a pid: \(afterPid - before) descriptors, not 10") }
  let pidfd = cgcd_pidfd_open(child, 0)
  guard pidfd >= 0 else { end("pidfd_open failed") }
  let fromPidfd = (0..<10).compactMap { _ in try? ProcSource(pidfd: pidfd, queue: .global()) }
  guard fromPidfd.count == 10 else { end("ProcSource(pidfd:) failed") }
  let afterPidfd = allOpenDescriptorTargets().count
  guard afterPidfd == afterPid + 1 else {
    end("10 sources from one pidfd: \(afterPidfd - afterPid - 1) descriptors beside the pidfd, not 0")
  }
  for source in fromPid + fromPidfd { source.resume() }
  end("ok")
}

private func checkOwnedPidfdClosedAfterExit() -> Never {
  warmUpDispatch()
  let pidfds = { openDescriptorTargets().filter { $0.value.contains("pidfd") }.count }
  let (child, end) = sleepingChild()
  let before = pidfds()
  guard let source = try? ProcSource(pid: child, queue: Queue(label: "proc.closed")) else { end("ProcSource failed") }
  guard pidfds() == before + 1 else { end("no pidfd opened") }
  let fired = Event()
  source.setEventHandler { fired.signal() }
  source.resume()
  kill(child, SIGKILL)
  guard fired.wait() else { end("no exit") }
  guard pollUntil({ pidfds() == before }) else { end("the pidfd is still open after the exit") }
  source.cancel()
  end("ok")
}

private func checkThousandProcSourcesLeakNothing() -> Never {
  markEveryDescriptorCloseOnExec()
  warmUpDispatch()
  let running = (try? spawnProcess("/bin/sleep", ["60"])) ?? -1
  let exited = (try? spawnProcess("/bin/true")) ?? -1
  guard running > 0, exited > 0 else { endProcChild("spawn failed") }
  var info = siginfo_t()
  _ = waitid(P_PID, id_t(exited), &info, WEXITED | WNOWAIT)
  let queue = Queue(label: "proc-many")
  // Only the descriptors the sources can own (pidfds): the runtime or a sanitizer may open and
  // close others meanwhile.
  let baseline = openDescriptorCount(where: isPidfd)
  createAndDropThousandProcSources(running: running, exited: exited, queue: queue, baseline: baseline)
  guard pollUntil({ openDescriptorCount(where: isPidfd) == baseline }) else {
    endProcChild("pidfds: \(baseline) before, \(openDescriptorCount(where: isPidfd)) after dropping 1,000 sources")
  }
  kill(running, SIGKILL)
  _ = reapProcess(running)
  _ = reapProcess(exited)
  endProcChild("ok")
}

/// Creates 1,000 sources in five states and drops them all on return.
private func isPidfd(_ target: String) -> Bool { target.contains("pidfd") }

private func createAndDropThousandProcSources(running: pid_t, exited: pid_t, queue: Queue, baseline: Int) {
  let delivered = Latch(count: 200)
  var sources: [ProcSource] = []
  for index in 0..<1000 {
    let pid = index % 5 == 4 ? exited : running
    guard let source = try? ProcSource(pid: pid, queue: queue) else { endProcChild("create \(index)") }
    switch index % 5 {
    case 0: break  // never resumed
    case 1: source.resume()  // running, dropped
    case 2:  // cancelled before the exit
      source.resume()
      source.cancel()
    case 3:  // suspended, dropped
      source.resume()
      source.suspend()
    default:  // on an exited process: fires, then dropped
      source.setEventHandler { delivered.signal() }
      source.resume()
    }
    sources.append(source)
  }
  // One pidfd per source; those of the cancelled sources and of the exits
  // already delivered may be closed by now.
  guard openDescriptorCount(where: isPidfd) >= baseline + 600 else { endProcChild("expected one pidfd per source") }
  requireInChild(delivered, "exit events on the exited process")
}

// MARK: - Helpers

/// Ends an exit test's child, reporting `message` on standard error, where
/// the parent looks for "ok" (the status stays 0 so that the parent gets
/// the message; a crash still fails the status check).
/// The parent's check of a child that ends with `endProcChild("ok")` once every check passed.
private func expectProcChildOK(_ result: ExitTest.Result?, sourceLocation: SourceLocation = #_sourceLocation) {
  let message = standardError(of: result)
  #expect(message.contains("ProcSourceTests child: ok"), "\(message)", sourceLocation: sourceLocation)
}

/// An exit-test child's sleeping child (`/bin/sleep 60`), and the child's end: it kills and reaps
/// the sleeper first, which holds this process's standard error too.
private func sleepingChild() -> (pid: pid_t, end: (String) -> Never) {
  let child = (try? spawnProcess("/bin/sleep", ["60"])) ?? -1
  guard child > 0 else { endProcChild("spawn failed") }
  return (
    child,
    { message in
      kill(child, SIGKILL)
      _ = reapProcess(child)
      endProcChild(message)
    }
  )
}

private func endProcChild(_ message: String) -> Never {
  let text = Array("ProcSourceTests child: \(message)\n".utf8)
  _ = text.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
  exit(0)
}

extension String {
  fileprivate func trimmingCharacters(in set: String) -> String {
    var text = Substring(self)
    while let first = text.first, set.contains(first) { text.removeFirst() }
    while let last = text.last, set.contains(last) { text.removeLast() }
    return String(text)
  }
}
