import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

@Suite("GCDError")
struct GCDErrorTests {
  @Test("description names the operation, the system message, errno and its name")
  func descriptionWithName() {
    let error = GCDError(operation: "ProcSource(pid: 99999)", errno: ESRCH)
    #expect(error.description == "ProcSource(pid: 99999): No such process (errno \(ESRCH), ESRCH)")
    #expect("\(error)" == error.description)
    #expect(String(describing: error) == error.description)
  }

  @Test("description appends the detail when there is one")
  func descriptionWithDetail() {
    let error = GCDError(operation: "SignalSource(signal: 9)", errno: EINVAL, detail: "SIGKILL cannot be observed")
    #expect(
      error.description
        == "SignalSource(signal: 9): Invalid argument (errno \(EINVAL), EINVAL): SIGKILL cannot be observed")
  }

  @Test("an errno without a known name reads without one")
  func descriptionWithoutName() {
    let error = GCDError(operation: "op", errno: 9_999)
    #expect(error.description == "op: \(String(cString: strerror(9_999))) (errno 9999)")
  }

  @Test(
    "every named errno is spelled as its C macro",
    arguments: [
      (EPERM, "EPERM"), (ENOENT, "ENOENT"), (ESRCH, "ESRCH"), (EINTR, "EINTR"), (EBADF, "EBADF"),
      (EAGAIN, "EAGAIN"), (ENOMEM, "ENOMEM"), (EACCES, "EACCES"), (EINVAL, "EINVAL"), (EMFILE, "EMFILE"),
      (ENFILE, "ENFILE"), (ENOSPC, "ENOSPC"), (EPIPE, "EPIPE"), (ENOSYS, "ENOSYS"), (ENOTSUP, "ENOTSUP"),
      (ERANGE, "ERANGE"), (ENOTDIR, "ENOTDIR"),
    ])
  func errnoNames(code: Int32, name: String) {
    let error = GCDError(operation: "op", errno: code)
    #expect(error.description.hasSuffix("(errno \(code), \(name))"))
  }

  @Test("systemMessage is strerror of errno")
  func systemMessage() {
    for code in [EPERM, ENOENT, EINVAL, EMFILE] {
      #expect(GCDError(operation: "op", errno: code).systemMessage == String(cString: strerror(code)))
    }
  }

  @Test("the stored properties read back and can be changed")
  func properties() {
    var error = GCDError(operation: "op", errno: EBADF)
    #expect(error.operation == "op")
    #expect(error.errno == EBADF)
    #expect(error.detail == nil)
    error.detail = "closed"
    error.errno = EPIPE
    #expect(error.description == "op: \(String(cString: strerror(EPIPE))) (errno \(EPIPE), EPIPE): closed")
  }

  @Test("errors are equal and hash equal when all their parts are")
  func hashable() {
    let first = GCDError(operation: "op", errno: EINVAL, detail: "d")
    let same = GCDError(operation: "op", errno: EINVAL, detail: "d")
    #expect(first == same)
    #expect(first.hashValue == same.hashValue)
    #expect(first != GCDError(operation: "op", errno: EINVAL))
    #expect(first != GCDError(operation: "op", errno: EPERM, detail: "d"))
    #expect(first != GCDError(operation: "other", errno: EINVAL, detail: "d"))
    #expect(Set([first, same]).count == 1)
  }

  @Test("a GCDError is thrown, caught and matched like any Error")
  func throwsAsError() {
    #expect(
      throws: GCDError(
        operation: "Semaphore(value: -1)", errno: EINVAL, detail: "the starting value must be zero or more")
    ) {
      _ = try Semaphore(value: -1)
    }
    let erased: any Error = GCDError(operation: "op", errno: EPERM)
    #expect((erased as? GCDError)?.errno == EPERM)
  }

  @Test(
    "with no descriptor left, every creation that needs one throws EMFILE naming its operation; nothing crashes, hangs or leaks",
    .timeLimit(.minutes(3)))
  func descriptorsExhausted() async {
    // A child that finds a descriptor freed behind its back (after it filled the table; seen in
    // about one full-suite run in ten, the closer not found) says so, and a new child runs: three
    // at most. Everything else it finds fails at once.
    var text = ""
    for _ in 0..<3 {
      let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        createWithNoDescriptorLeft()
      }
      text = standardError(of: result)
      if !text.contains("exit-test child: precondition lost") { break }
    }
    #expect(text.contains("exit-test child: ok"), "\(text)")
  }
}

/// In an exit test's child: fills the descriptor table (under a lowered
/// `RLIMIT_NOFILE`), then creates each object that needs a descriptor of its
/// own and checks the `GCDError` it throws; then frees descriptors and checks
/// the same creations work.
func createWithNoDescriptorLeft() {
  // libdispatch opens its epoll and eventfd descriptors on first use: warm it first.
  let queue = Queue(label: "emfile")
  let warm = DataAddSource(queue: queue)
  let fired = Event()
  warm.setEventHandler { fired.signal() }
  warm.resume()
  warm.merge(1)
  requireInChild(fired, "the warm-up source did not fire")

  // A socket pair for IOChannel, made while descriptors are free.
  var pair: [Int32] = [-1, -1]
  childCheck(
    socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0,
    "socketpair: errno \(errno)")

  var limit = rlimit()
  childCheck(getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, "getrlimit: errno \(errno)")
  limit.rlim_cur = rlim_t(openDescriptorTargets().keys.max() ?? 0) + 32
  childCheck(setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, "setrlimit: errno \(errno)")
  var fillers: [Int32] = []
  // Filled again before each creation: a descriptor closed behind the test meanwhile must not count
  // (and one closed during a creation is caught after it: `freeDescriptors`).
  func fill() {
    while true {
      let descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC)
      if descriptor < 0 {
        childCheck(errno == EMFILE, "filling the table stopped with errno \(errno), not EMFILE")
        break
      }
      fillers.append(descriptor)
    }
  }
  fill()

  // How many descriptors are free now (opened and closed again, up to `limit`): a creation that
  // failed has closed what it opened, so after one the table is as full as before it.
  func freeDescriptors(upTo limit: Int) -> Int {
    var opened: [Int32] = []
    while opened.count < limit {
      let descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC)
      if descriptor < 0 { break }
      opened.append(descriptor)
    }
    opened.forEach { close($0) }
    return opened.count
  }

  func expectEMFILE(
    _ what: String, naming operation: String, filled: Bool = true, _ create: () throws(GCDError) -> Source
  ) {
    if filled { fill() }
    let leftFree = filled ? 0 : 1
    do {
      let source = try create()
      source.cancel()
      endChild("precondition lost: \(what) was created with no descriptor left (or one freed behind the test)")
    } catch {
      if freeDescriptors(upTo: leftFree + 1) > leftFree {
        endChild("precondition lost: a descriptor was freed behind the test during \(what) (\(error))")
      }
      childCheck(error.errno == EMFILE, "\(what): errno \(error.errno) (\(error)), expected EMFILE")
      childCheck(error.operation.contains(operation), "\(what): '\(error.operation)' does not name \(operation)")
      childCheck(error.description.contains("EMFILE"), "\(what): '\(error)' does not say EMFILE")
    }
  }
  let directory = TemporaryDirectory()
  // The process's shared inotify instance is the first descriptor a FileSystemSource needs.
  expectEMFILE("the shared inotify instance", naming: "inotify_init1") { () throws(GCDError) in
    try FileSystemSource(path: directory.path, events: .write, queue: queue)
  }
  expectEMFILE("ProcSource's pidfd", naming: "pidfd_open") { () throws(GCDError) in
    try ProcSource(pid: getpid(), queue: queue)
  }
  // A read or write source on a pipe or socket takes an epoll instance of its own (the nest that
  // keeps hang-ups away from libdispatch); a ProcSource takes one beside its pidfd.
  expectEMFILE("ReadSource's epoll instance", naming: "epoll_create1") { () throws(GCDError) in
    try ReadSource(fileDescriptor: pair[1], queue: queue)
  }
  expectEMFILE("WriteSource's epoll instance", naming: "epoll_create1") { () throws(GCDError) in
    try WriteSource(fileDescriptor: pair[1], queue: queue)
  }
  close(fillers.removeLast())
  expectEMFILE("ProcSource's epoll instance", naming: "epoll_create1", filled: false) { () throws(GCDError) in
    try ProcSource(pid: getpid(), queue: queue)
  }
  let refill = open("/dev/null", O_RDONLY | O_CLOEXEC)
  childCheck(refill >= 0, "the ProcSource that could not get its epoll instance kept its pidfd open")
  fillers.append(refill)
  // With a few descriptors back, a FileSystemSource makes the shared instance (kept, so that no
  // close happens behind the test's back); then the table is filled again, and the watch's own
  // descriptor finds none.
  for descriptor in fillers.suffix(8) { close(descriptor) }
  fillers.removeLast(8)
  let first: FileSystemSource
  do {
    first = try FileSystemSource(path: directory.path, events: .write, queue: queue)
  } catch {
    endChild("failed: with descriptors free, the first FileSystemSource threw \(error)")
  }
  while true {
    let descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC)
    if descriptor < 0 { break }
    fillers.append(descriptor)
  }
  expectEMFILE("FileSystemSource's watch descriptor", naming: ": open") { () throws(GCDError) in
    try FileSystemSource(path: directory.path, events: .write, queue: queue)
  }
  expectEMFILE("FileSystemSource(fileDescriptor:)'s watch descriptor", naming: ": open") {
    () throws(GCDError) in
    try FileSystemSource(fileDescriptor: fillers[0], events: .write, queue: queue)
  }
  // A socket channel needs no descriptor of its own: it reads and writes on the package's sources,
  // behind the descriptor fence, whose one epoll instance this child has not made yet. With no
  // descriptor left for it, the read reports EMFILE; the cleanup runs once the channel is closed.
  do {
    let ended = Event()
    let cleaned = Event()
    let error = Mutex<Int32>(0)
    let channel = IOChannel(fileDescriptor: pair[0], type: .stream, queue: queue) { _ in cleaned.signal() }
    childCheck(channel.unsafeObject == nil, "a socket channel got a C channel")
    channel.read(length: 1, queue: queue) { done, _, failure in
      guard done else { return }
      error.withLock { $0 = failure }
      ended.signal()
    }
    childCheck(ended.wait(), "the read of a socket channel with no descriptor left for the fence never ended")
    childCheck(error.withLock { $0 } == EMFILE, "that read ended with errno \(error.withLock { $0 }), not EMFILE")
    channel.close()
    childCheck(cleaned.wait(), "the cleanup of that socket channel never ran after close()")
  }
  first.cancel()
  // Nothing was left open by the failures: with descriptors back, each creation works.
  for descriptor in fillers.suffix(4) { close(descriptor) }
  fillers.removeLast(4)
  do {
    let watch = try FileSystemSource(path: directory.path, events: .write, queue: queue)
    let process = try ProcSource(pid: getpid(), queue: queue)
    watch.cancel()
    process.cancel()
  } catch {
    endChild("failed: with descriptors free again, creation threw \(error)")
  }
  let written = Event()
  let writeError = Mutex<Int32>(-1)
  let channel = IOChannel(fileDescriptor: pair[0], type: .stream, queue: queue) { close($0) }
  channel.write(data: [42], queue: queue) { done, _, failure in
    guard done else { return }
    writeError.withLock { $0 = failure }
    written.signal()
  }
  childCheck(written.wait(), "with descriptors free again, the socket channel's write never ended")
  var byte: UInt8 = 0
  childCheck(
    writeError.withLock { $0 } == 0 && recv(pair[1], &byte, 1, 0) == 1 && byte == 42,
    "with descriptors free again, the socket channel did not write its byte (errno \(writeError.withLock { $0 }))")
  close(pair[1])
  for descriptor in fillers { close(descriptor) }
  endChild("ok")
}
