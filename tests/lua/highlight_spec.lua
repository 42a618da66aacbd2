-- highlight.lua: SGR style → group name and attributes; the plugin's linked groups.
local t = ...
local hl = require('agent_bash.highlight')

t.describe('style_group', function()
  local cases = {
    { {}, nil },
    { { fg = 1 }, 'AgentBashAnsi_f1' },
    { { bg = 4 }, 'AgentBashAnsi_b4' },
    { { fg = '#FF8800', bg = 232 }, 'AgentBashAnsi_fff8800_b232' },
    { { bold = true }, 'AgentBashAnsi_B' },
    { { fg = 2, bold = true, dim = true, italic = true, underline = true, reverse = true, strikethrough = true }, 'AgentBashAnsi_f2_BDIURS' },
    { { bold = false }, nil },
  }
  for _, c in ipairs(cases) do
    t.it(vim.inspect(c[1], { newline = ' ', indent = '' }), function()
      t.eq(c[2], hl.style_group(c[1]))
    end)
  end
end)

t.describe('attrs', function()
  t.it('indexed colours 0-15 use the fixed palette', function()
    vim.g.terminal_color_1 = nil
    t.eq({ fg = '#cd0000', ctermfg = 1 }, hl.attrs({ fg = 1 }))
  end)

  t.it('indexed colours 0-15 follow g:terminal_color_N', function()
    vim.g.terminal_color_1 = '#AA0000'
    t.eq({ fg = '#aa0000', ctermfg = 1 }, hl.attrs({ fg = 1 }))
    vim.g.terminal_color_1 = nil
  end)

  t.it('cube and grey ramp', function()
    t.eq('#000000', hl.hex(16))
    t.eq('#ff0000', hl.hex(196))
    t.eq('#5f87af', hl.hex(67))
    t.eq('#080808', hl.hex(232))
    t.eq('#eeeeee', hl.hex(255))
  end)

  t.it('hex colours get the nearest cterm index', function()
    t.eq({ bg = '#ff0000', ctermbg = 196 }, hl.attrs({ bg = '#FF0000' }))
    t.eq(67, hl.nearest('#5f87af'))
  end)

  t.it('flags for gui and cterm; dim without colour is grey', function()
    t.eq({ bold = true, underline = true, cterm = { bold = true, underline = true } }, hl.attrs({ bold = true, underline = true }))
    t.eq({ fg = '#7f7f7f', ctermfg = 8 }, hl.attrs({ dim = true }))
  end)
end)

t.describe('groups', function()
  t.it('links with default = true and survives :colorscheme', function()
    hl.setup()
    t.eq({ link = 'Title', default = true }, vim.api.nvim_get_hl(0, { name = 'AgentBashHeader' }))
    vim.api.nvim_set_hl(0, 'AgentBashOk', { fg = '#123456' }) -- a user's override wins
    hl.setup()
    t.eq(tonumber('123456', 16), vim.api.nvim_get_hl(0, { name = 'AgentBashOk' }).fg)
    hl.ensure('AgentBashAnsi_f1', { fg = 1 })
    vim.cmd('colorscheme default')
    t.eq('DiagnosticOk', vim.api.nvim_get_hl(0, { name = 'AgentBashOk' }).link)
    t.eq(tonumber('cd0000', 16), vim.api.nvim_get_hl(0, { name = 'AgentBashAnsi_f1' }).fg)
  end)

  t.it('every group is documented', function()
    local doc = table.concat(vim.fn.readfile(t.root .. '/doc/agent_bash.txt'), '\n')
    for name in pairs(hl.groups) do
      t.ok(doc:find('*' .. name .. '*', 1, true), name .. ' has no help tag')
    end
  end)
end)
