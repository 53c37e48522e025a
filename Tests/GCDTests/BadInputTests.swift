import GCD
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Bad input gets a thrown `GCDError` that names the call and reads well,
/// and leaves nothing behind: the process holds the same descriptors after
/// every failed creation. Each type's suite tests its own errors one by
/// one; this suite checks them all together for what they leave behind,
/// in a child process so that no other test opens descriptors meanwhile.
///
/// A timer interval of zero or less is a programmer error, not bad input
/// from outside: `schedule` is non-throwing and stops with a message
/// (TimerSourceTests.zeroIntervalStops; the negative case here).
@Suite("Bad input")
struct BadInputTests {
  @Test("every bad argument throws a readable GCDError naming the call, and no descriptor stays open")
  func everyBadArgumentThrowsAndLeavesNothing() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      tryEveryBadArgument()
    }
    let text = standardError(of: result)
    #expect(text.contains("exit-test child: ok"), "\(text)")
  }

  @Test("a negative timer interval stops the process with a message naming the call")
  func negativeTimerIntervalStops() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let timer = TimerSource(queue: .global())
      timer.schedule(start: .now, interval: .seconds(-1))
    }
    let text = standardError(of: result)
    #expect(
      text.contains("TimerSource.schedule(interval: -1.0 seconds): the interval must be at least 1 nanosecond"),
      "\(text)")
  }
}

/// One bad call: what it is, the errno it must throw, and the text its
/// description must contain besides the errno's name.
private struct BadCall {
  let call: String
  let errno: Int32
  let names: String
  let attempt: () throws -> Void

  init(_ call: String, _ errno: Int32, names: String? = nil, _ attempt: @escaping () throws -> Void) {
    self.call = call
    self.errno = errno
    self.names = names ?? call
    self.attempt = attempt
  }
}

private func tryEveryBadArgument() -> Never {
  markEveryDescriptorCloseOnExec()
  warmUpDispatch()
  let reaped = (try? spawnProcess("/bin/true")) ?? -1
  childCheck(reaped > 0 && reapProcess(reaped) == 0, "could not start and reap /bin/true")
  let missing = "/tmp/GCDTests-no-such-file-\(getpid())"
  let existing = temporaryFile(containing: [])
  defer { unlink(existing) }
  let queue = Queue(label: "bad.input")
  // A FileSystemSource creates the process's inotify instance on first use:
  // let it exist before counting.
  _ = try? FileSystemSource(path: existing, events: .write, queue: queue)
  // Dropped, it closes its O_PATH descriptor on `queue`, after removing its watch.
  childCheck(
    pollUntil { inotifyWatchCount() == 0 && !openDescriptorTargets().values.contains(existing) },
    "the warm-up source's watch or descriptor stayed")
  let directory = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
  childCheck(directory >= 0, "could not open /tmp")
  // Descriptor numbers that were open a moment ago (none of the calls below
  // opens one that stays, so they are not reused meanwhile).
  let (closedRead, closedWrite) = makePipe()
  close(closedRead)
  close(closedWrite)
  let before = openDescriptorTargets()

  let calls: [BadCall] = [
    BadCall("Semaphore(value: -1)", EINVAL) { _ = try Semaphore(value: -1) },
    BadCall("ReadSource(fileDescriptor: -1)", EBADF) { _ = try ReadSource(fileDescriptor: -1, queue: queue) },
    BadCall("ReadSource(fileDescriptor: \(closedRead))", EBADF) {
      _ = try ReadSource(fileDescriptor: closedRead, queue: queue)
    },
    BadCall("WriteSource(fileDescriptor: -1)", EBADF) { _ = try WriteSource(fileDescriptor: -1, queue: queue) },
    BadCall("WriteSource(fileDescriptor: \(closedWrite))", EBADF) {
      _ = try WriteSource(fileDescriptor: closedWrite, queue: queue)
    },
    BadCall("ReadSource(fileDescriptor: \(directory))", EISDIR, names: "use FileSystemSource") {
      _ = try ReadSource(fileDescriptor: directory, queue: queue)
    },
    BadCall("WriteSource(fileDescriptor: \(directory))", EISDIR, names: "use FileSystemSource") {
      _ = try WriteSource(fileDescriptor: directory, queue: queue)
    },
    BadCall("FileSystemSource(fileDescriptor: -1", EBADF) {
      _ = try FileSystemSource(fileDescriptor: -1, events: .write, queue: queue)
    },
    BadCall("FileSystemSource(fileDescriptor: \(closedRead)", EBADF) {
      _ = try FileSystemSource(fileDescriptor: closedRead, events: .write, queue: queue)
    },
    BadCall("FileSystemSource(path: \"\(missing)\"", ENOENT, names: "nothing at \(missing)") {
      _ = try FileSystemSource(path: missing, events: .write, queue: queue)
    },
    BadCall("FileSystemSource(path: \"\"", ENOENT) {
      _ = try FileSystemSource(path: "", events: .write, queue: queue)
    },
    BadCall("FileSystemSource(path: \"\(existing)\", events: [])", EINVAL, names: "no events to watch") {
      _ = try FileSystemSource(path: existing, events: [], queue: queue)
    },
    BadCall("ProcSource(pid: \(reaped)", ESRCH, names: "no process with this id") {
      _ = try ProcSource(pid: reaped, queue: queue)
    },
    BadCall("ProcSource(pid: 0", EINVAL) { _ = try ProcSource(pid: 0, queue: queue) },
    BadCall("ProcSource(pid: \(getpid()), events: [])", EINVAL, names: "no events to watch") {
      _ = try ProcSource(pid: getpid(), events: [], queue: queue)
    },
    BadCall("ProcSource(pid: \(getpid()), events: [.fork])", ENOTSUP, names: "unsupported on Linux") {
      _ = try ProcSource(pid: getpid(), events: .fork, queue: queue)
    },
    BadCall("SignalSource(signal: \(SIGKILL))", EINVAL, names: "SIGKILL cannot be caught or observed") {
      _ = try SignalSource(signal: SIGKILL, queue: queue)
    },
    BadCall("SignalSource(signal: \(SIGSEGV))", EINVAL, names: "SIGSEGV means the process is broken") {
      _ = try SignalSource(signal: SIGSEGV, queue: queue)
    },
    BadCall("SignalSource(signal: 65)", EINVAL, names: "not a signal number") {
      _ = try SignalSource(signal: 65, queue: queue)
    },
    BadCall("SignalSource(signal: 32)", EINVAL, names: "the C library's own (glibc: SIGCANCEL 32, SIGSETXID 33") {
      _ = try SignalSource(signal: 32, queue: queue)
    },
    BadCall("SignalSource(signal: \(SIGPIPE))", EINVAL, names: "SIGPIPE is one libdispatch never blocks") {
      _ = try SignalSource(signal: SIGPIPE, queue: queue)
    },
    BadCall("SignalSource.sequence(of: [\(SIGTERM), 33])", EINVAL, names: "signal 33 is the C library's own") {
      _ = try SignalSource.sequence(of: [SIGTERM, 33], queue: queue)
    },
  ]
  for bad in calls {
    do {
      try bad.attempt()
      endChild("failed: \(bad.call) did not throw")
    } catch let error as GCDError {
      let text = error.description
      childCheck(error.errno == bad.errno, "\(bad.call) threw errno \(error.errno), expected \(bad.errno): \(text)")
      childCheck(text.contains(bad.call), "\(bad.call): the description does not name the call: \(text)")
      childCheck(text.contains(bad.names), "\(bad.call): the description does not say \"\(bad.names)\": \(text)")
      childCheck(text.contains(String(cString: strerror(bad.errno))), "\(bad.call): no system message: \(text)")
    } catch {
      endChild("failed: \(bad.call) threw \(type(of: error)), not GCDError: \(error)")
    }
  }
  childCheck(
    pollUntil { sameDescriptors(openDescriptorTargets(), before) },
    "descriptors before: \(before.sorted { $0.key < $1.key }), after: "
      + "\(openDescriptorTargets().sorted { $0.key < $1.key })")
  childCheck(inotifyWatchCount() == 0, "\(inotifyWatchCount()) inotify watches left")
  endChild("ok: \(calls.count) bad calls")
}
