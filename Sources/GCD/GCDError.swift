#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The one error type of this package: the operation that failed and the
/// `errno` value that says why.
///
/// Printed, it reads like `ProcSource(pid: 99999): No such process (errno 3, ESRCH)`.
public struct GCDError: Error, Hashable, Sendable, CustomStringConvertible {
  /// What was attempted, named after the Swift call and its argument.
  public var operation: String
  /// The C `errno` value (`EINVAL` for arguments the package itself rejects).
  public var errno: Int32
  /// An explanation beyond `strerror`, when the package has one.
  public var detail: String?

  public init(operation: String, errno: Int32, detail: String? = nil) {
    self.operation = operation
    self.errno = errno
    self.detail = detail
  }

  /// The system's text for `errno` (`strerror`).
  public var systemMessage: String { String(cString: strerror(errno)) }

  public var description: String {
    var text = "\(operation): \(systemMessage) (errno \(errno)"
    if let name = GCDError.errnoNames[errno] { text += ", \(name)" }
    text += ")"
    if let detail { text += ": \(detail)" }
    return text
  }

  static let errnoNames: [Int32: String] = [
    EPERM: "EPERM", ENOENT: "ENOENT", ESRCH: "ESRCH", EINTR: "EINTR", EBADF: "EBADF",
    EAGAIN: "EAGAIN", ENOMEM: "ENOMEM", EACCES: "EACCES", EINVAL: "EINVAL",
    EMFILE: "EMFILE", ENFILE: "ENFILE", ENOSPC: "ENOSPC", EPIPE: "EPIPE",
    ENOSYS: "ENOSYS", ENOTSUP: "ENOTSUP", ERANGE: "ERANGE", ENOTDIR: "ENOTDIR",
  ]

  /// An error carrying the calling thread's current `errno`.
  static func fromErrno(_ operation: String, detail: String? = nil) -> GCDError {
    GCDError(operation: operation, errno: Glibc.errno, detail: detail)
  }
}
