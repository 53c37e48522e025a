import CDispatch
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Every constant the package spells in Swift equals the C value it stands
/// for (swift-system's habit): the option sets' raw values, the QoS classes,
/// the priority bands, `DISPATCH_TIME_FOREVER`, and the errno and signal
/// numbers the C boundary names.
@Suite("Constants")
struct ConstantsTests {
  @Test("ProcEvents are the DISPATCH_PROC_* flags")
  func procEvents() {
    #expect(ProcEvents.exit.rawValue == UInt(DISPATCH_PROC_EXIT))
    #expect(ProcEvents.fork.rawValue == UInt(DISPATCH_PROC_FORK))
    #expect(ProcEvents.exec.rawValue == UInt(DISPATCH_PROC_EXEC))
    #expect(ProcEvents.signal.rawValue == UInt(DISPATCH_PROC_SIGNAL))
    #expect(ProcEvents.all == [.exit, .fork, .exec, .signal])
  }

  @Test("FileSystemEvents are the DISPATCH_VNODE_* flags")
  func fileSystemEvents() {
    #expect(FileSystemEvents.delete.rawValue == UInt(DISPATCH_VNODE_DELETE))
    #expect(FileSystemEvents.write.rawValue == UInt(DISPATCH_VNODE_WRITE))
    #expect(FileSystemEvents.extend.rawValue == UInt(DISPATCH_VNODE_EXTEND))
    #expect(FileSystemEvents.attrib.rawValue == UInt(DISPATCH_VNODE_ATTRIB))
    #expect(FileSystemEvents.link.rawValue == UInt(DISPATCH_VNODE_LINK))
    #expect(FileSystemEvents.rename.rawValue == UInt(DISPATCH_VNODE_RENAME))
    #expect(FileSystemEvents.revoke.rawValue == UInt(DISPATCH_VNODE_REVOKE))
  }

  /// No header on Linux defines `QOS_CLASS_*` (libdispatch has them
  /// built in), so each class is checked by libdispatch's own reading of
  /// it: a queue attribute made with the class reads back as that class (an
  /// unknown value reads back as unspecified; libdispatch on Linux records
  /// `.userInteractive` as `.userInitiated`).
  @Test("Queue.QoS classes are the values libdispatch knows as QOS_CLASS_*")
  func qosClasses() {
    // Through the C calls themselves: `Queue(label:qos:)` stops on a class libdispatch does not know.
    func readBack(_ qosClass: UInt32) -> UInt32 {
      let attr = Libdispatch.queue_attr_make_with_qos_class(nil, qosClass, 0)
      let queue = Libdispatch.queue_create("constants.qos", attr)
      defer { Libdispatch.release(queue) }
      return Libdispatch.queue_get_qos_class(queue).0
    }
    #expect(readBack(Queue.QoS.userInteractive.rawClass) == Queue.QoS.userInitiated.rawClass)
    for qos in [Queue.QoS.userInitiated, .default, .utility, .background] {
      #expect(readBack(qos.rawClass) == qos.rawClass, "\(qos)")
      #expect(readBack(qos.rawClass + 1) == Queue.QoS.unspecified.rawClass, "\(qos) + 1 is no class")
    }
    #expect(Queue.QoS.unspecified.rawClass == 0)
  }

  /// `DISPATCH_QUEUE_PRIORITY_BACKGROUND` is `INT16_MIN`, which Swift does
  /// not import: each band is also checked by the label libdispatch gives
  /// the global queue it selects.
  @Test("Queue.Priority identifiers are the DISPATCH_QUEUE_PRIORITY_* values")
  func priorities() {
    #expect(Queue.Priority.high.identifier == Int(DISPATCH_QUEUE_PRIORITY_HIGH))
    #expect(Queue.Priority.default.identifier == Int(DISPATCH_QUEUE_PRIORITY_DEFAULT))
    #expect(Queue.Priority.low.identifier == Int(DISPATCH_QUEUE_PRIORITY_LOW))
    #expect(Queue.Priority.background.identifier == Int(Int16.min))
    let labels: [(Queue.Priority, String)] = [
      (.high, "user-initiated"), (.default, "default"), (.low, "utility"), (.background, "background"),
    ]
    for (priority, qos) in labels {
      #expect(Queue.global(priority).label == "com.apple.root.\(qos)-qos", "\(priority)")
    }
  }

  @Test("Deadline.forever is DISPATCH_TIME_FOREVER")
  func forever() {
    #expect(Deadline.forever.rawValue == DISPATCH_TIME_FOREVER)
    #expect(Libdispatch.timeForever == DISPATCH_TIME_FOREVER)
  }

  @Test("the errno values the boundary names are the C library's")
  func errnoValues() {
    let pairs: [(Int32, Int32, String)] = [
      (Errno.notPermitted, EPERM, "EPERM"), (Errno.noSuchFileOrDirectory, ENOENT, "ENOENT"),
      (Errno.noSuchProcess, ESRCH, "ESRCH"), (Errno.interrupted, EINTR, "EINTR"),
      (Errno.badFileDescriptor, EBADF, "EBADF"),
      (Errno.noMemory, ENOMEM, "ENOMEM"), (Errno.permissionDenied, EACCES, "EACCES"),
      (Errno.isDirectory, EISDIR, "EISDIR"), (Errno.invalidArgument, EINVAL, "EINVAL"),
      (Errno.tooManyOpenFilesInSystem, ENFILE, "ENFILE"), (Errno.tooManyOpenFiles, EMFILE, "EMFILE"),
      (Errno.noSpace, ENOSPC, "ENOSPC"),
      (Errno.noFunction, ENOSYS, "ENOSYS"), (Errno.notSupported, ENOTSUP, "ENOTSUP"),
      (Errno.canceled, ECANCELED, "ECANCELED"), (Errno.busy, EBUSY, "EBUSY"),
      (Errno.illegalSeek, ESPIPE, "ESPIPE"),
    ]
    for (swift, c, name) in pairs {
      #expect(swift == c, "\(name)")
      #expect(Errno.names[c] == name)
    }
    // Named for messages only: the kernel returns them, no code of the package compares with them.
    let namedOnly: [(Int32, String)] = [
      (EAGAIN, "EAGAIN"), (EPIPE, "EPIPE"), (ERANGE, "ERANGE"), (ENOTDIR, "ENOTDIR"), (ECONNRESET, "ECONNRESET"),
    ]
    for (c, name) in namedOnly { #expect(Errno.names[c] == name) }
    #expect(Errno.names.count == pairs.count + namedOnly.count)
  }

  @Test("the unobservable signals are the C library's numbers, under their C names")
  func signalNumbers() {
    let expected: [(Int32, String)] = [
      (SIGKILL, "SIGKILL"), (SIGSTOP, "SIGSTOP"), (SIGSEGV, "SIGSEGV"), (SIGBUS, "SIGBUS"), (SIGILL, "SIGILL"),
      (SIGFPE, "SIGFPE"), (SIGTRAP, "SIGTRAP"), (SIGSYS, "SIGSYS"), (SIGPIPE, "SIGPIPE"), (SIGPROF, "SIGPROF"),
    ]
    #expect(unobservableSignals.map(\.number) == expected.map(\.0))
    #expect(unobservableSignals.map(\.name) == expected.map(\.1))
    for (number, name) in expected {
      #expect(!SignalSource.canObserve(number), "\(name)")
      #expect(SignalSource.rejection(of: number)?.hasPrefix(name) == true, "\(name)")
    }
    #expect(SignalSource.canObserve(SIGHUP) && SignalSource.rejection(of: SIGHUP) == nil)
  }
}
