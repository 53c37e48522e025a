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

  /// Creates an error for `operation` that failed with `errno`.
  ///
  /// - Parameters:
  ///   - operation: The Swift call that failed, with its arguments.
  ///   - errno: The C `errno` value.
  ///   - detail: What the package knows beyond `strerror`.
  public init(operation: String, errno: Int32, detail: String? = nil) {
    self.operation = operation
    self.errno = errno
    self.detail = detail
  }

  /// The system's text for `errno` (`strerror`).
  public var systemMessage: String { system_strerror(errno) }

  /// "operation: message (errno N, ENAME): detail".
  public var description: String {
    var text = "\(operation): \(systemMessage) (errno \(errno)"
    if let name = Errno.names[errno] { text += ", \(name)" }
    text += ")"
    if let detail { text += ": \(detail)" }
    return text
  }
}
