// Reproduces `WriteDataToFile(filename)` ("Writing Data to a Descriptor"): `open` with
// `O_WRONLY | O_CREAT | O_TRUNC`, a WRITE source on the default global queue whose handler gets
// `MyGetDataSize()` bytes from `MyGetData`, writes them, and cancels the source; the cancel handler
// closes the descriptor.
//
// On Linux: epoll cannot watch a regular file, so libdispatch treats it as always writable and the
// handler runs at once. The listing's mode bits S_ISUID | S_ISGID are left out (set-id bits on a data
// file are a mistake); the file is checked by reading it back.
//
// Usage: ExampleWriteFile [path of the file to write, default: a temporary file, removed afterwards]

import GCD
import Glibc
import Synchronization

let handlerCalls = Atomic<Int>(0)
let written = Atomic<Int>(0)
let finished = try! Semaphore(value: 0)

/// The data the listing's `MyGetData` provides: 64 KB of numbered lines.
let payload: [UInt8] = {
  var text = ""
  var line = 0
  while text.utf8.count < 64 * 1024 {
    line += 1
    text += "line \(line): the write source's handler wrote this\n"
  }
  return Array(text.utf8)
}()

/// `MyGetDataSize`.
func myGetDataSize() -> Int { payload.count }

/// `MyGetData`: fills `buffer` with up to `size` bytes; returns how many.
func myGetData(_ buffer: UnsafeMutableRawPointer, _ size: Int) -> Int {
  let count = min(size, payload.count)
  payload.withUnsafeBytes { buffer.copyMemory(from: $0.baseAddress!, byteCount: count) }
  return count
}

/// The listing's `WriteDataToFile`; returns the started source, or nil if the file cannot be opened.
func writeDataToFile(_ filename: String) -> WriteSource? {
  let fd = open(filename, O_WRONLY | O_CREAT | O_TRUNC, S_IRUSR | S_IWUSR)
  if fd == -1 { return nil }
  // The listing's `fcntl(fd, F_SETFL)`: the descriptor stays blocking ("Block during the write").

  guard let writeSource = try? WriteSource(fileDescriptor: fd, queue: .global()) else {
    close(fd)
    return nil
  }

  writeSource.setEventHandler { [unowned writeSource] in
    handlerCalls.add(1, ordering: .relaxed)
    let bufferSize = myGetDataSize()
    let buffer = UnsafeMutableRawPointer.allocate(byteCount: bufferSize, alignment: 1)
    let actual = myGetData(buffer, bufferSize)
    // A blocking write of a regular file writes everything unless the disk is full; loop regardless.
    var offset = 0
    while offset < actual {
      let result = write(fd, buffer + offset, actual - offset)
      if result < 0 && errno == EINTR { continue }
      if result <= 0 { break }
      offset += result
    }
    written.store(offset, ordering: .relaxed)
    buffer.deallocate()
    // Cancel the source when done (the caller releases it).
    writeSource.cancel()
  }

  writeSource.setCancelHandler {
    close(fd)
    finished.signal()
  }
  writeSource.resume()
  return writeSource
}

let path: String
if CommandLine.arguments.count > 1 {
  path = CommandLine.arguments[1]
} else {
  var template = Array("/tmp/ExampleWriteFile-XXXXXX".utf8CString)
  let fd = mkstemp(&template)
  guard fd >= 0 else {
    print("cannot create a temporary file")
    exit(1)
  }
  close(fd)
  path = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
}

print("writing \(payload.count) bytes to \(path) through a write source on the default global queue")
guard let source = writeDataToFile(path) else {
  print("cannot open \(path)")
  exit(1)
}
let descriptor = source.fileDescriptor
guard finished.wait(timeout: .seconds(10)) else {
  print("the source did not finish writing in 10 s")
  exit(1)
}

// Read the file back.
var readBack: [UInt8] = []
if let file = fopen(path, "rb") {
  var chunk = [UInt8](repeating: 0, count: 65536)
  while true {
    let count = fread(&chunk, 1, chunk.count, file)
    if count <= 0 { break }
    readBack.append(contentsOf: chunk.prefix(count))
  }
  fclose(file)
}
if CommandLine.arguments.count == 1 { unlink(path) }

print("handler calls: \(handlerCalls.load(ordering: .relaxed)) (it cancels the source after one write)")
print("bytes written: \(written.load(ordering: .relaxed)) of \(payload.count)")
print("read back \(readBack.count) bytes; content matches: \(readBack == payload)")
let closed = fcntl(descriptor, F_GETFD) == -1 && errno == EBADF
print("descriptor \(descriptor) closed by the cancel handler: \(closed)")
exit(readBack == payload && closed ? 0 : 1)
