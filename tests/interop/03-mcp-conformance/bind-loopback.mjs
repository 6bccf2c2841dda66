// Preloaded into the "everything" server (`node --import`): its CLI listens on $PORT on every
// interface; this makes it listen on 127.0.0.1 only, and prints `PORT <n>` once listening
// (so PORT=0 gives an ephemeral port the suite can read). The server's code is unchanged.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const [port, host] = args;
  if ((typeof port === "number" || typeof port === "string") && typeof host !== "string") {
    args.splice(1, 0, "127.0.0.1");
  }
  this.once("listening", () => {
    const address = this.address();
    if (address && typeof address === "object") {
      process.stderr.write(`PORT ${address.port}\n`);
    }
  });
  return listen.apply(this, args);
};
