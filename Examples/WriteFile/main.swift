// Reproduces `WriteDataToFile(filename)` ("Writing Data to a Descriptor"): `open` with `O_WRONLY |
// O_CREAT | O_TRUNC`, a WRITE source on the default global queue whose handler writes the data
// `MyGetData` provides and cancels the source; the cancel handler closes the descriptor.
//
// On Linux: epoll cannot watch a regular file, so libdispatch reports it writable at once. The
// listing's S_ISUID | S_ISGID mode bits are left out: set-id bits on a data file are a mistake.
//
// Usage: ExampleWriteFile [file, default /tmp/ExampleWriteFile.txt] [text, default "Hello, write source!\n"]

import GCD
import Glibc

let arguments = CommandLine.arguments
let filename = arguments.count > 1 ? arguments[1] : "/tmp/ExampleWriteFile.txt"
let text = arguments.count > 2 ? arguments[2] : "Hello, write source!\n"
let closed = try! Semaphore(value: 0)

func myGetDataSize() -> Int { text.utf8.count }

/// Copies up to `size` bytes of the text into `buffer`; returns how many.
func myGetData(_ buffer: UnsafeMutableRawPointer, _ size: Int) -> Int {
  let bytes = Array(text.utf8.prefix(size))
  buffer.copyMemory(from: bytes, byteCount: bytes.count)
  return bytes.count
}

func writeDataToFile(_ filename: String) -> WriteSource? {
  let fd = open(filename, O_WRONLY | O_CREAT | O_TRUNC, S_IRUSR | S_IWUSR)
  if fd == -1 { return nil }
  // The listing's fcntl(fd, F_SETFL) leaves the descriptor blocking: "Block during the write."

  guard let writeSource = try? WriteSource(fileDescriptor: fd, queue: .global(.default)) else {
    close(fd)
    return nil
  }
  writeSource.setEventHandler {
    let bufferSize = myGetDataSize()
    let buffer = malloc(max(bufferSize, 1))!
    let actual = myGetData(buffer, bufferSize)
    print("event handler: write(fd, buffer, \(actual)) returned \(write(fd, buffer, actual))")
    free(buffer)
    // Cancel and release the dispatch source when done.
    writeSource.cancel()
  }
  writeSource.setCancelHandler {
    print("cancel handler: close(fd) returned \(close(fd))")
    closed.signal()
  }
  writeSource.resume()
  return writeSource
}

print("writing \(myGetDataSize()) bytes to \(filename)")
let source = writeDataToFile(filename)
precondition(source != nil, "cannot open \(filename)")
precondition(closed.wait(timeout: .seconds(10)), "the source did not finish writing in 10 s")
