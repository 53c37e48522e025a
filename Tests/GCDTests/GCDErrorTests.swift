import GCD
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
}
