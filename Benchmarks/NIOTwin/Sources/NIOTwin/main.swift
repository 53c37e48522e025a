import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

// The SwiftNIO twin of the HTTP probe server `GCDBenchmarks --http-server PORT SECONDS`
// (Benchmarks/GCDBenchmarks/ChurnProbe.swift): HTTP/1.1 on 127.0.0.1:PORT, every request answered
// with a 2-byte "ok", `Connection: close` honoured, SECONDS seconds of service, then one line
// `http-server: served N connections, M requests` (Benchmarks/http.sh reads M).
//
//   NIOTwin PORT SECONDS
#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#elseif canImport(Darwin)
  import Darwin
#endif

let arguments = CommandLine.arguments
guard arguments.count == 3, let port = Int(arguments[1]), let seconds = UInt32(arguments[2]) else {
  let usage = "usage: NIOTwin PORT SECONDS\n"
  _ = usage.withCString { write(2, $0, strlen($0)) }
  exit(2)
}

/// Connections closed and requests answered, as the GCD probe counts them.
let served = Atomic<Int>(0)
let requests = Atomic<Int>(0)

/// Answers each request at its `.end`; closes after the write when the request was not keep-alive
/// (`Connection: close`, or HTTP/1.0 without keep-alive), as NIO's HTTP examples do.
final class ProbeHandler: ChannelInboundHandler {
  typealias InboundIn = HTTPServerRequestPart
  typealias OutboundOut = HTTPServerResponsePart

  private var keepAlive = true
  private var body: ByteBuffer

  init(allocator: ByteBufferAllocator) {
    body = allocator.buffer(staticString: "ok")
  }

  func channelRead(context: ChannelHandlerContext, data: NIOAny) {
    switch Self.unwrapInboundIn(data) {
    case .head(let request):
      keepAlive = request.isKeepAlive
    case .body:
      break
    case .end:
      requests.add(1, ordering: .relaxed)
      var headers = HTTPHeaders()
      headers.add(name: "Content-Length", value: "2")
      headers.add(name: "Content-Type", value: "text/plain")
      if !keepAlive { headers.add(name: "Connection", value: "close") }
      context.write(
        Self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
      context.write(Self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
      if keepAlive {
        context.writeAndFlush(Self.wrapOutboundOut(.end(nil)), promise: nil)
      } else {
        let loopBoundContext = context.loopBound
        context.writeAndFlush(Self.wrapOutboundOut(.end(nil))).whenComplete { _ in
          loopBoundContext.value.close(promise: nil)
        }
      }
    }
  }

  func channelInactive(context: ChannelHandlerContext) {
    served.add(1, ordering: .relaxed)
    context.fireChannelInactive()
  }

  func errorCaught(context: ChannelHandlerContext, error: any Error) {
    context.close(promise: nil)
  }
}

signal(SIGPIPE, SIG_IGN)
let group = MultiThreadedEventLoopGroup(numberOfThreads: System.coreCount)
let bootstrap = ServerBootstrap(group: group)
  .serverChannelOption(.backlog, value: 1024)
  .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
  .childChannelInitializer { channel in
    channel.eventLoop.makeCompletedFuture {
      try channel.pipeline.syncOperations.configureHTTPServerPipeline()
      try channel.pipeline.syncOperations.addHandler(ProbeHandler(allocator: channel.allocator))
    }
  }
let listener = try bootstrap.bind(host: "127.0.0.1", port: port).wait()
print("http-server (NIO): listening on 127.0.0.1:\(port) for \(seconds) s")
fflush(nil)
sleep(seconds)
try? listener.close().wait()
print(
  "http-server: served \(served.load(ordering: .relaxed)) connections, \(requests.load(ordering: .relaxed)) requests")
fflush(nil)
try? group.syncShutdownGracefully()
