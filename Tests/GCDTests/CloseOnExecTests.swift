import GCD
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Every descriptor the package opens, and every one libdispatch opens for
/// it, is close-on-exec: a program started while sources run inherits none.
/// ProcSourceTests and FileSystemSourceTests check the flag on the pidfd,
/// the inotify instance and the `O_PATH` descriptor; this test starts a
/// real child and looks at what it got.
@Suite("Close on exec")
struct CloseOnExecTests {
  @Test("a child started while every kind of source runs inherits none of the package's or libdispatch's descriptors")
  func childInheritsNothing() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      startChildWhileEverySourceRuns()
    }
    expectChildSaidOK(result)
  }
}

/// What the descriptors opened for sources refer to, as /proc shows them.
private let packageDescriptorKinds = ["inotify", "pidfd", "eventpoll", "eventfd", "timerfd", "signalfd"]

private func startChildWhileEverySourceRuns() -> Never {
  let queue = Queue(label: "cloexec")
  let (readEnd, writeEnd) = makePipe()
  let file = temporaryFile(containing: [])
  let regularFile = temporaryFile(containing: patternBytes(16))
  let fileDescriptor = open(regularFile, O_RDONLY | O_CLOEXEC)
  let watched = (try? spawnProcess("/bin/sleep", ["600"])) ?? -1
  childCheck(watched > 0 && fileDescriptor >= 0, "setup failed")
  killAtExit(watched)
  signal(SIGUSR2, SIG_IGN)

  // Sources of every kind that opens a descriptor, each started.
  let timer = TimerSource(queue: queue)
  timer.schedule(start: .now + .seconds(3600))
  let sources: [Source]
  do {
    sources = [
      timer,
      try ReadSource(fileDescriptor: readEnd, queue: queue),  // epoll
      try ReadSource(fileDescriptor: fileDescriptor, queue: queue),  // an eventfd for a regular file
      try WriteSource(fileDescriptor: writeEnd, queue: queue),
      try SignalSource(signal: SIGUSR2, queue: queue),  // signalfd
      try ProcSource(pid: watched, queue: queue),  // pidfd
      try FileSystemSource(path: file, events: .write, queue: queue),  // inotify, O_PATH
    ]
  } catch {
    endChild("failed: \(error)")
  }
  let registered = Latch(count: sources.count)
  for source in sources {
    source.setRegistrationHandler { registered.signal() }
    source.resume()
  }
  childCheck(registered.wait(), "\(registered.count) sources did not register")
  // Queue.main's wake-up descriptor, which Queue.dispatchMain() polls.
  let mainQueueWork = Event()
  Queue.main.async { mainQueueWork.signal() }

  let ours = openDescriptorTargets().filter { descriptor, target in
    packageDescriptorKinds.contains { target.contains($0) } || target == file
  }
  for kind in ["inotify", "pidfd", "eventpoll", "timerfd", "signalfd"] {
    childCheck(ours.values.contains { $0.contains(kind) }, "no \(kind) descriptor open: \(ours)")
  }
  childCheck(ours.values.contains(file), "no O_PATH descriptor on the watched file: \(ours)")

  // The child lists its descriptors. Everything this process did not mark
  // close-on-exec reaches it — the exit test's own pipes, the user's pipe
  // above — but nothing opened for the sources may.
  let inherited = descriptorsOfChild()
  let leaked = inherited.filter { descriptor, target in
    descriptor > 2 && (packageDescriptorKinds.contains { target.contains($0) } || target == file)
  }
  childCheck(!inherited.isEmpty, "the child listed no descriptors")
  childCheck(leaked.isEmpty, "the child inherited \(leaked.sorted { $0.key < $1.key }) (open here: \(ours))")
  for source in sources { source.cancel() }
  unlink(file)
  unlink(regularFile)
  endChild("ok: \(ours.count) descriptors for sources, none inherited by /bin/ls")
}

/// Starts `/bin/ls -l /proc/self/fd` and returns what it listed: each
/// descriptor of the child and what it refers to.
private func descriptorsOfChild() -> [Int32: String] {
  var ends: [Int32] = [-1, -1]
  guard pipe(&ends) == 0 else { return [:] }
  _ = fcntl(ends[0], F_SETFD, FD_CLOEXEC)
  let child = try? spawnProcess("/bin/ls", ["-l", "/proc/self/fd"], stdout: ends[1])
  close(ends[1])
  let listing = readToEnd(ends[0])
  close(ends[0])
  if let child { reapProcess(child) }
  var result: [Int32: String] = [:]
  for line in listing.split(separator: "\n") {
    // "lrwx------ 1 root root 64 Jan  1 00:00 5 -> anon_inode:inotify"
    let parts = line.split(separator: " -> ", maxSplits: 1)
    guard parts.count == 2, let number = parts[0].split(separator: " ").last.flatMap({ Int32($0) }) else { continue }
    result[number] = String(parts[1])
  }
  return result
}
