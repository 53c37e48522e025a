// Reproduces `ProcessContentsOfFile(filename)` ("Reading Data from a Descriptor"): open the file,
// `fcntl(fd, F_SETFL, O_NONBLOCK)`, a READ source on the default global queue whose handler reads
// `dispatch_source_get_data() + 1` bytes for `MyProcessFileData` and cancels the source when that says
// it is done; the cancel handler closes the descriptor.
//
// On Linux: epoll cannot watch a regular file, so the source reports it readable, with the bytes left
// as its data, until the source is cancelled; `MyProcessFileData` is done when `read` returns 0.
//
// Usage: ExampleReadFile [file, default /etc/passwd]

import GCD
import Glibc
import Synchronization

let filename = CommandLine.arguments.count > 1 ? CommandLine.arguments[1] : "/etc/passwd"
let totals = Mutex((bytes: 0, lines: 0))
let closed = try! Semaphore(value: 0)

/// Counts the bytes and lines of the file; done (true) at the end of the file or on an error.
func myProcessFileData(_ buffer: UnsafeMutableRawBufferPointer, _ actual: Int) -> Bool {
  guard actual > 0 else {
    let (bytes, lines) = totals.withLock { $0 }
    print("MyProcessFileData: \(actual == 0 ? "end of file" : "error \(errno)") after \(bytes) bytes, \(lines) lines")
    return true
  }
  let lines = buffer.prefix(actual).filter { $0 == UInt8(ascii: "\n") }.count
  totals.withLock { $0 = ($0.bytes + actual, $0.lines + lines) }
  return false
}

func processContentsOfFile(_ filename: String) -> ReadSource? {
  // Prepare the file for reading.
  let fd = open(filename, O_RDONLY)
  if fd == -1 { return nil }
  _ = fcntl(fd, F_SETFL, O_NONBLOCK)  // Avoid blocking the read operation

  guard let readSource = try? ReadSource(fileDescriptor: fd, queue: .global(.default)) else {
    close(fd)
    return nil
  }
  // Install the event handler
  readSource.setEventHandler {
    let estimated = readSource.bytesAvailable + 1
    // Read the data into a text buffer.
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: estimated, alignment: 1)
    let actual = read(fd, buffer.baseAddress, estimated)
    print("event handler: \(estimated - 1) bytes available, read \(actual)")
    let done = myProcessFileData(buffer, actual)  // Process the data.
    // Release the buffer when done.
    buffer.deallocate()
    // If there is no more data, cancel the source.
    if done { readSource.cancel() }
  }
  // Install the cancellation handler
  readSource.setCancelHandler {
    print("cancel handler: close(fd) returned \(close(fd))")
    closed.signal()
  }
  // Start reading the file.
  readSource.resume()
  return readSource
}

let source = processContentsOfFile(filename)
precondition(source != nil, "cannot open \(filename)")
precondition(closed.wait(timeout: .seconds(10)), "the source did not finish reading in 10 s")
