// Reproduces `ProcessContentsOfFile(filename)` ("Reading Data from a Descriptor"): open the file,
// `fcntl(fd, F_SETFL, O_NONBLOCK)`, a READ source on the default global queue whose handler reads
// `dispatch_source_get_data() + 1` bytes and passes them to `MyProcessFileData`, `dispatch_source_cancel`
// when done, and a cancel handler that closes the descriptor.
//
// On Linux: epoll cannot watch a regular file, so libdispatch treats it as always readable and the
// handler runs until the source is cancelled — `MyProcessFileData` says "done" when `read` returns 0
// (end of file). The descriptor stays the program's: only the cancel handler closes it.
//
// Usage: ExampleReadFile [path of a file to read, default: a 200 KB file this program writes]

import GCD
import Glibc
import Synchronization

/// What the handler has read so far, and how many times it ran.
let received = Mutex<[UInt8]>([])
let handlerCalls = Atomic<Int>(0)
let estimates = Mutex<(first: Int, last: Int)>((-1, -1))
let finished = try! Semaphore(value: 0)

/// `MyProcessFileData`: keeps the bytes; returns true ("done") at end of file or on an error.
func myProcessFileData(_ buffer: UnsafeMutableRawBufferPointer, _ actual: Int) -> Bool {
  if actual > 0 {
    received.withLock { $0.append(contentsOf: buffer.prefix(actual)) }
    return false
  }
  if actual < 0 && (errno == EAGAIN || errno == EINTR) { return false }
  return true
}

/// The listing's `ProcessContentsOfFile`; returns the started source, or nil if the file cannot be opened.
func processContentsOfFile(_ filename: String) -> ReadSource? {
  // Prepare the file for reading.
  let fd = open(filename, O_RDONLY)
  if fd == -1 { return nil }
  _ = fcntl(fd, F_SETFL, O_NONBLOCK)  // Avoid blocking the read operation.

  guard let readSource = try? ReadSource(fileDescriptor: fd, queue: .global()) else {
    close(fd)
    return nil
  }

  // Install the event handler. It captures the source unowned: the caller keeps it alive until the
  // cancel handler has run (a strong capture would keep it alive until it is cancelled, too).
  readSource.setEventHandler { [unowned readSource] in
    let estimated = readSource.bytesAvailable + 1
    handlerCalls.add(1, ordering: .relaxed)
    estimates.withLock { estimates in
      if estimates.first < 0 { estimates.first = estimated - 1 }
      estimates.last = estimated - 1
    }
    // Read the data into a buffer.
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: estimated, alignment: 1)
    let actual = read(fd, buffer.baseAddress, estimated)
    let done = myProcessFileData(buffer, actual)  // Process the data.
    // Release the buffer when done.
    buffer.deallocate()
    // If there is no more data, cancel the source.
    if done { readSource.cancel() }
  }

  // Install the cancellation handler.
  readSource.setCancelHandler {
    close(fd)
    finished.signal()
  }

  // Start reading the file.
  readSource.resume()
  return readSource
}

// The file to read: the argument, or a file of 200 KB of known bytes.
var path: String
var expected: [UInt8]
if CommandLine.arguments.count > 1 {
  path = CommandLine.arguments[1]
  guard let file = fopen(path, "rb") else {
    print("cannot open \(path)")
    exit(1)
  }
  expected = []
  var chunk = [UInt8](repeating: 0, count: 65536)
  while true {
    let count = fread(&chunk, 1, chunk.count, file)
    if count <= 0 { break }
    expected.append(contentsOf: chunk.prefix(count))
  }
  fclose(file)
} else {
  var template = Array("/tmp/ExampleReadFile-XXXXXX".utf8CString)
  let fd = mkstemp(&template)
  path = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
  expected = (0..<200 * 1024).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) }
  guard fd >= 0, write(fd, expected, expected.count) == expected.count else {
    print("cannot write \(path)")
    exit(1)
  }
  close(fd)
}

print("reading \(path) (\(expected.count) bytes) through a read source on the default global queue")
guard let source = processContentsOfFile(path) else {
  print("cannot open \(path)")
  exit(1)
}
let descriptor = source.fileDescriptor
guard finished.wait(timeout: .seconds(10)) else {
  print("the source did not finish reading in 10 s")
  exit(1)
}
if CommandLine.arguments.count == 1 { unlink(path) }

let bytes = received.withLock { $0 }
let (firstEstimate, lastEstimate) = estimates.withLock { $0 }
print("handler calls: \(handlerCalls.load(ordering: .relaxed))")
print("bytes available at the first call: \(firstEstimate), at the last call (end of file): \(lastEstimate)")
print("bytes read: \(bytes.count) of \(expected.count)")
print("whole file read, byte for byte: \(bytes == expected)")
print("cancelled: \(source.isCancelled)")
let closed = fcntl(descriptor, F_GETFD) == -1 && errno == EBADF
print("descriptor \(descriptor) closed by the cancel handler: \(closed)")
exit(bytes == expected && closed ? 0 : 1)
